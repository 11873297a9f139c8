"""The orphan sweeper against moto (server mode) and the strict Azure/GCP fakes: instances, disks, NICs,
volumes and addresses of jobs that are no longer active are deleted; an active job's are kept."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import boto3
import httpx
import pytest

from providers.aws import AwsProvider
from providers.azure import AzureProvider
from providers.base import TAG_JOB, TAG_REQUEST
from providers.gcp import GcpProvider, gce_labels
from providers.sweeper import Sweeper, sweep

from .builders import make_offer
from .conftest import GCP_PROJECT, FakeCredential
from .faultproxy import FaultProxy

pytestmark = pytest.mark.network
NOW = datetime(2030, 1, 1, tzinfo=UTC)  # far after every launch: past any grace period


@pytest.fixture
def aws(ec2_faults: FaultProxy) -> AwsProvider:
    return AwsProvider(["us-east-1"], endpoint_url=ec2_faults.url, access_key="testing", secret_key="testing")


@pytest.fixture
def azure(arm_faults: FaultProxy, pki) -> AzureProvider:
    return AzureProvider("sub-1", regions=["eastus"], resource_group="hb-sweep", credential=FakeCredential(),
                         base_url=arm_faults.url, connection_verify=pki.ca_cert)


@pytest.fixture
def gcp(gcp_proxy: FaultProxy, gcp_creds: dict[str, str], pki) -> GcpProvider:
    return GcpProvider(GCP_PROJECT, zones=["us-central1-a"], credentials_file=gcp_creds["key"],
                       endpoint=gcp_proxy.url, billing_url=gcp_proxy.url, ca_bundle=pki.ca_cert,
                       token_cache=gcp_creds["token"], poll_interval_seconds=0)


def _jobs() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:6]
    return f"gone-{tag}", f"live-{tag}"


def test_aws_instances_volumes_enis_and_addresses_of_ended_jobs_are_swept(aws: AwsProvider,
                                                                         moto_endpoint: str) -> None:
    gone, live = _jobs()
    o = make_offer("aws", "us-east-1", "m5.large", 0.096)
    [g] = aws.launch(o, 1, f"{gone}-r0", tags={TAG_JOB: gone})
    [keep] = aws.launch(o, 1, f"{live}-r0", tags={TAG_JOB: live})
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    spec = [{"ResourceType": "volume", "Tags": [{"Key": TAG_JOB, "Value": gone},
                                                 {"Key": TAG_REQUEST, "Value": f"{gone}-r0"}]}]
    vol = ec2.create_volume(AvailabilityZone="us-east-1a", Size=8, TagSpecifications=spec)["VolumeId"]
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    eni = ec2.create_network_interface(SubnetId=subnet,
                                       TagSpecifications=[dict(spec[0], ResourceType="network-interface")])
    eip = ec2.allocate_address(Domain="vpc", TagSpecifications=[dict(spec[0], ResourceType="elastic-ip")])
    deleted = sweep({"aws": aws}, [live], now=NOW, grace_seconds=0)
    kinds = sorted((d.kind, d.job) for d in deleted if d.job == gone)
    assert kinds == [("address", gone), ("instance", gone), ("nic", gone), ("volume", gone)]
    assert not any(d.job == live for d in deleted)
    assert ec2.describe_volumes(Filters=[{"Name": "volume-id", "Values": [vol]}])["Volumes"] == []
    nid = eni["NetworkInterface"]["NetworkInterfaceId"]
    assert ec2.describe_network_interfaces(Filters=[{"Name": "network-interface-id", "Values": [nid]}])[
        "NetworkInterfaces"] == []
    assert not [a for a in ec2.describe_addresses()["Addresses"] if a["AllocationId"] == eip["AllocationId"]]
    states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances(
        InstanceIds=[g.id, keep.id])["Reservations"] for i in r["Instances"]}
    assert states[g.id] in ("shutting-down", "terminated") and states[keep.id] in ("pending", "running")
    aws.terminate([keep.id], "cleanup")


def test_azure_vms_nics_and_disks_of_ended_jobs_are_swept(azure: AzureProvider, azure_fake, pki) -> None:
    gone, live = _jobs()
    o = make_offer("azure", "eastus", "Standard_D2s_v5", 0.096)
    [g] = azure.launch(o, 1, f"{gone}-r0", tags={TAG_JOB: gone})
    [keep] = azure.launch(o, 1, f"{live}-r0", tags={TAG_JOB: live})
    base = f"{azure_fake.url}/subscriptions/sub-1/resourceGroups/hb-sweep/providers"
    nic = {"location": "eastus", "tags": {TAG_JOB: gone, TAG_REQUEST: f"{gone}-r1"},
           "properties": {"ipConfigurations": [{"name": "c", "properties": {
               "subnet": {"id": azure._subnet("eastus")}}}]}}
    assert httpx.put(f"{base}/Microsoft.Network/networkInterfaces/hb-left-nic", json=nic,
                     verify=pki.ca_cert).status_code == 201  # a NIC whose VM was never created
    st = azure_fake.app.state
    st.disks[("sub-1", "hb-sweep", "hb-old_osdisk_1_x")] = {  # the OS disk of a VM deleted with "Detach"
        "id": "/subscriptions/sub-1/resourceGroups/hb-sweep/providers/Microsoft.Compute/disks/hb-old_OsDisk_1_x",
        "name": "hb-old_OsDisk_1_x", "location": "eastus", "managedBy": None, "tags": {}}
    deleted = sweep({"azure": azure}, [live], now=NOW, grace_seconds=0)
    assert sorted((d.kind, d.id) for d in deleted) == [("disk", "hb-old_OsDisk_1_x"), ("instance", g.id),
                                                        ("nic", "hb-left-nic")]
    left = sorted(v["name"] for k, v in [*st.vms.items(), *st.nics.items(), *st.disks.items()] if k[1] == "hb-sweep")
    assert [n for n in left if not n.startswith(keep.id)] == []  # only the live job's VM, NIC and disk
    assert {keep.id, f"{keep.id}-nic"} <= set(left)
    azure.terminate([keep.id], "cleanup")


def test_gcp_instances_and_disks_of_ended_jobs_are_swept(gcp: GcpProvider, gcp_fake) -> None:
    gone, live = _jobs()
    o = make_offer("gcp", "us-central1", "e2-small", 0.02)
    [g] = gcp.launch(o, 1, f"{gone}-r0", tags={TAG_JOB: gone})
    [keep] = gcp.launch(o, 1, f"{live}-r0", tags={TAG_JOB: live})
    st = gcp_fake.app.state
    st.disks[("us-central1-a", f"hb-left-{gone}")] = {  # a boot disk left by a VM deleted without it
        "kind": "compute#disk", "name": f"hb-left-{gone}", "zone": "zones/us-central1-a", "users": [],
        "labels": gce_labels({TAG_JOB: gone, TAG_REQUEST: f"{gone}-r0"}),
        "selfLink": f"https://x/zones/us-central1-a/disks/hb-left-{gone}"}
    deleted = sweep({"gcp": gcp}, [live], now=NOW, grace_seconds=0)
    assert sorted((d.kind, d.id) for d in deleted) == [("disk", f"us-central1-a/hb-left-{gone}"), ("instance", g.id)]
    assert ("us-central1-a", f"hb-left-{gone}") not in st.disks
    assert tuple(g.id.split("/")) not in st.instances and tuple(keep.id.split("/")) in st.instances
    gcp.terminate([keep.id], "cleanup")


def test_the_sweeper_waits_one_interval_and_keeps_young_instances(gcp: GcpProvider, gcp_fake) -> None:
    gone, _ = _jobs()
    [g] = gcp.launch(make_offer("gcp", "us-central1", "e2-small", 0.02), 1, f"{gone}-r0", tags={TAG_JOB: gone})
    sw = Sweeper(interval_seconds=60, grace_seconds=3600)
    start = datetime.now(UTC)
    assert sw.maybe_run({"gcp": gcp}, list, start) == []  # the first call only starts the clock
    assert not sw.due(start + timedelta(seconds=59))
    assert sw.maybe_run({"gcp": gcp}, list, start + timedelta(seconds=61)) == []  # due, but the VM is young
    assert tuple(g.id.split("/")) in gcp_fake.app.state.instances
    assert [d.id for d in sweep({"gcp": gcp}, [], now=start + timedelta(hours=2), grace_seconds=3600)] == [g.id]


def test_sweeper_settings_come_from_the_environment() -> None:
    sw = Sweeper.from_env({"BROKER_SWEEP_INTERVAL_SECONDS": "30", "BROKER_SWEEP_GRACE_SECONDS": "bad"})
    assert (sw.interval_seconds, sw.grace_seconds) == (30.0, 600.0)
