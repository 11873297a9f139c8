"""Azure adapter: the real azure-mgmt-compute SDK and httpx against a local HTTPS fake of ARM and the
Retail Prices API, with a fault proxy in front that answers ARM's own error payloads."""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from broker.clock import ManualClock
from broker.errors import AuthError, CapacityError, InvalidRequestError
from broker.model import Capacity, Instance, InstanceState, RetryPolicy
from providers.azure import AzureProvider, accelerator_of, parse_retail_prices
from providers.base import TAG_JOB, TAG_REQUEST, Provider
from providers.failover import provision

from .builders import make_job, make_offer, make_option, wait_ended
from .conftest import FakeCredential
from .fake_azure import price_rows
from .faultproxy import FaultProxy, arm_error, request, throttle

pytestmark = pytest.mark.network

DEFAULT_RETRY = RetryPolicy()


@pytest.fixture
def azure(arm_faults: FaultProxy, pki) -> Iterator[AzureProvider]:
    yield AzureProvider("sub-1", regions=["eastus", "westeurope"], credential=FakeCredential(),
                        base_url=arm_faults.url, connection_verify=pki.ca_cert,
                        prices_url=arm_faults.url + "/api/retail/prices")


def live_vms(azure_fake, request_id: str) -> list[str]:
    return [vm["name"] for vm in azure_fake.app.state.vms.values() if vm["tags"].get(TAG_REQUEST) == request_id]


def test_retail_price_rows_keep_linux_consumption_and_tell_spot_apart() -> None:
    ondemand, spot = parse_retail_prices(price_rows("eastus"))
    assert ondemand["Standard_D2s_v5"] == 0.096 and spot["Standard_D2s_v5"] == pytest.approx(0.0192)
    assert ondemand["Standard_NC4as_T4_v3"] == 0.526  # not the Windows (x1.96) nor dev/test (x0.9) row


def test_offers_follow_pages_and_drop_restricted_skus(azure: AzureProvider, arm_faults: FaultProxy) -> None:
    azure.regions = ["eastus"]
    offers = azure.offers()
    od = {o.instance_type.name: o for o in offers if o.capacity is Capacity.ON_DEMAND}
    assert sorted(od) == ["Standard_D2s_v5", "Standard_D4s_v5", "Standard_NC4as_T4_v3"]  # E2s restricted
    t4 = od["Standard_NC4as_T4_v3"].instance_type
    assert (t4.vcpus, t4.memory_gib, t4.gpus, t4.accelerator) == (4, 28, 1, "T4")
    assert {o.instance_type.name for o in offers if o.capacity is Capacity.SPOT} == set(od)
    price_pages = [c for c in arm_faults.calls if c.path == "/api/retail/prices"]
    assert len(price_pages) == 5  # 20 rows, 4 per page, followed through NextPageLink
    assert accelerator_of("Standard_ND96asr_A100_v4") == "A100"


def test_round_trip_launch_list_terminate(azure: AzureProvider, azure_fake) -> None:
    assert isinstance(azure, Provider)
    req = f"req-{uuid.uuid4().hex[:8]}"
    offer = next(o for o in azure.offers() if o.instance_type.name == "Standard_D2s_v5"
                 and o.region == "westeurope" and o.capacity is Capacity.SPOT)
    made = azure.launch(offer, 2, req, tags={TAG_JOB: "job-az"})
    assert len(made) == 2 and all(i.state is InstanceState.RUNNING for i in made)
    assert all(i.instance_type == "Standard_D2s_v5" and i.region == "westeurope" for i in made)
    vm = azure_fake.app.state.vms[("sub-1", "hybrid-broker", made[0].id)]
    assert vm["properties"]["priority"] == "Spot" and vm["tags"][TAG_JOB] == "job-az"
    assert sorted(i.id for i in azure.launch(offer, 2, req, tags={TAG_JOB: "job-az"})) == sorted(
        i.id for i in made)
    assert sorted(i.id for i in azure.instances({TAG_JOB: "job-az"})) == sorted(i.id for i in made)
    azure.terminate([i.id for i in made] + ["never-existed"], req)
    assert azure.instances({TAG_JOB: "job-az"}) == [] and live_vms(azure_fake, req) == []


EAST = make_option("azure", "eastus", "Standard_D2s_v5", 0.096)
WEST = make_option("azure", "westeurope", "Standard_D2s_v5", 0.1056)


def _provision(azure: AzureProvider, options, retry=DEFAULT_RETRY):
    req = f"req-{uuid.uuid4().hex[:8]}"
    clock = ManualClock()
    out = provision(options, lambda name: azure, request_id=req, tags={TAG_JOB: "job-f"}, job=None,
                    retry=retry, clock=clock, rng=random.Random(3))
    return out, req, clock


def test_sku_not_available_fails_over_to_the_next_region(azure: AzureProvider, arm_faults: FaultProxy,
                                                         azure_fake) -> None:
    arm_faults.add(request("PUT", "/virtualMachines/"), arm_error("SkuNotAvailable"))
    out, req, _ = _provision(azure, [EAST, WEST])
    assert [a.outcome for a in out.attempts] == ["capacity", "launched"]
    assert out.option == WEST and "SkuNotAvailable" in out.attempts[0].message
    azure.terminate([i.id for i in out.instances], req)
    assert live_vms(azure_fake, req) == []


def test_http_429_backs_off_then_succeeds(azure: AzureProvider, arm_faults: FaultProxy, azure_fake) -> None:
    arm_faults.add(request("PUT", "/virtualMachines/"), throttle(retry_after=30), times=3)
    out, req, clock = _provision(azure, [EAST], retry=RetryPolicy(6, 10, 120))
    assert [a.outcome for a in out.attempts] == ["transient"] * 3 + ["launched"]
    assert len(clock.sleeps) == 3 and all(a.retryable for a in out.attempts[:3])
    assert all(slept >= 30 for slept in clock.sleeps)  # ARM's Retry-After, read through the SDK, is honoured
    azure.terminate([i.id for i in out.instances], req)


def test_quota_then_auth_stops_and_leaves_nothing(azure: AzureProvider, arm_faults: FaultProxy,
                                                  azure_fake) -> None:
    arm_faults.add(request("PUT", "/virtualMachines/"), arm_error("OperationNotAllowed", "cores quota"))
    arm_faults.add(request("PUT", "/virtualMachines/"), arm_error("AuthorizationFailed", status=403))
    out, req, _ = _provision(azure, [EAST, WEST])
    assert [a.outcome for a in out.attempts] == ["quota", "auth"]
    assert isinstance(out.error, AuthError) and live_vms(azure_fake, req) == []


def test_a_vm_created_behind_an_error_is_deleted_on_abandon(azure: AzureProvider, arm_faults: FaultProxy,
                                                            azure_fake) -> None:
    arm_faults.add(request("PUT", "/virtualMachines/"), arm_error("AllocationFailed"), times=-1,
                   passthrough=True)
    out, req, _ = _provision(azure, [EAST, WEST])
    assert isinstance(out.error, CapacityError)
    assert live_vms(azure_fake, req) == []
    assert any(c.method == "DELETE" for c in arm_faults.calls)


# -- jobs: cloud-init custom data runs in the fake's guest; the exit code comes back through boot diagnostics


def inventory(azure_fake, request_id: str) -> list[str]:
    """VMs, NICs and disks of ``request_id`` the fake still holds (disks by the VM that owns them)."""
    st = azure_fake.app.state
    vms = [f"vm {vm['name']}" for vm in st.vms.values() if vm["tags"].get(TAG_REQUEST) == request_id]
    nics = [f"nic {n['name']}" for n in st.nics.values() if n["tags"].get(TAG_REQUEST) == request_id]
    names = {v.split(" ", 1)[1] for v in vms} | {n["name"].removesuffix("-nic") for n in st.nics.values()
                                                 if n["tags"].get(TAG_REQUEST) == request_id}
    disks = [f"disk {d['name']}" for d in st.disks.values() if d["name"].split("_OsDisk")[0] in names
             or (d.get("managedBy") or "").rsplit("/", 1)[-1] in names]
    exts = [f"extension {vm}/{e['name']}" for (_, _, vm, _), e in st.extensions.items()
            if e["tags"].get(TAG_REQUEST) == request_id]
    return vms + nics + disks + exts


def orphan_disks(azure_fake) -> list[str]:
    return [d["name"] for d in azure_fake.app.state.disks.values()
            if not any(d["managedBy"] == vm["id"] for vm in azure_fake.app.state.vms.values())]


def wait_done(provider: Any, req: str) -> Instance:
    return wait_ended(provider, req)


def _offer(azure: AzureProvider, capacity: Capacity = Capacity.ON_DEMAND, region: str = "eastus"):
    return next(o for o in azure.offers() if o.instance_type.name == "Standard_D2s_v5" and o.region == region
                and o.capacity is capacity)


AZ_JOBS = [
    ("a command that succeeds ends SUCCEEDED with code 0 and its output", ("sh", "-c", "echo hi from $WHO"),
     InstanceState.SUCCEEDED, 0, "hi from azure\n"),
    ("a failing command ends FAILED with its own code", ("sh", "-c", "echo bad >&2; exit 9"),
     InstanceState.FAILED, 9, "bad\n"),
]


@pytest.mark.parametrize(("command", "state", "code", "tail"), [c[1:] for c in AZ_JOBS], ids=[c[0] for c in AZ_JOBS])
def test_a_job_runs_from_custom_data_and_reports_through_boot_diagnostics(
    azure: AzureProvider, azure_fake, command, state, code, tail
) -> None:
    req = f"req-{uuid.uuid4().hex[:8]}"
    job = make_job("az-job", command=command, env={"WHO": "azure"})
    [inst] = azure.launch(_offer(azure), 1, req, tags={TAG_JOB: "az-job"}, job=job)
    vm = azure_fake.app.state.vms[("sub-1", "hybrid-broker", inst.id)]
    assert "customData" not in vm["properties"]["osProfile"]  # write-only, as in ARM
    assert vm["hb_custom_data"].startswith("#!/bin/sh\n")
    assert vm["properties"]["networkProfile"]["networkInterfaces"][0]["id"].endswith(f"/{inst.id}-nic")
    done = wait_done(azure, req)
    assert (done.state, done.exit_code, done.log_tail) == (state, code, tail)
    azure.terminate([done.id], req)
    assert inventory(azure_fake, req) == [] and orphan_disks(azure_fake) == []


def test_a_cancelled_job_leaves_no_vm_nic_or_disk(azure: AzureProvider, azure_fake) -> None:
    req = f"req-{uuid.uuid4().hex[:8]}"
    [inst] = azure.launch(_offer(azure), 1, req, tags={TAG_JOB: "az-cancel"},
                          job=make_job("az-cancel", command=("sleep", "30")))
    assert [i.state for i in azure.instances({TAG_REQUEST: req})] == [InstanceState.RUNNING]
    azure.terminate([inst.id], f"{req}:cancel")
    assert inventory(azure_fake, req) == [] and orphan_disks(azure_fake) == []


def test_an_evicted_spot_vm_is_reported_once_and_deleted(azure: AzureProvider, azure_fake) -> None:
    req = f"req-{uuid.uuid4().hex[:8]}"
    [inst] = azure.launch(_offer(azure, Capacity.SPOT), 1, req, tags={TAG_JOB: "az-spot"},
                          job=make_job("az-spot", command=("sleep", "30")))
    vm = azure_fake.app.state.vms[("sub-1", "hybrid-broker", inst.id)]
    assert vm["properties"]["evictionPolicy"] == "Deallocate"
    azure_fake.app.state.evict(inst.id)
    done = wait_done(azure, req)
    assert (done.state, done.exit_code) == (InstanceState.TERMINATED, None)
    [err] = azure.poll_errors()
    assert isinstance(err, CapacityError) and err.code == "evicted"
    azure.instances({TAG_REQUEST: req})
    assert azure.poll_errors() == []
    azure.terminate([done.id], req)
    assert inventory(azure_fake, req) == []


def test_a_capacity_error_fails_over_runs_the_job_and_leaves_nothing(azure: AzureProvider, arm_faults: FaultProxy,
                                                                     azure_fake) -> None:
    arm_faults.add(request("PUT", "/virtualMachines/"), arm_error("AllocationFailed"))
    req = f"req-{uuid.uuid4().hex[:8]}"
    out = provision([EAST, WEST], lambda name: azure, request_id=req, tags={TAG_JOB: "az-fo"},
                    job=make_job("az-fo", command=("true",)), retry=DEFAULT_RETRY, clock=ManualClock(),
                    rng=random.Random(3))
    assert [a.outcome for a in out.attempts] == ["capacity", "launched"] and out.option == WEST
    done = wait_done(azure, req)
    assert (done.region, done.state, done.exit_code) == ("westeurope", InstanceState.SUCCEEDED, 0)
    azure.terminate([done.id], req)
    assert inventory(azure_fake, req) == [] and orphan_disks(azure_fake) == []


def test_the_resource_group_and_vnet_are_created_when_missing(arm_faults: FaultProxy, pki, azure_fake) -> None:
    rg = f"hb-rg-{uuid.uuid4().hex[:6]}"
    az = AzureProvider("sub-1", regions=["eastus"], resource_group=rg, credential=FakeCredential(),
                       base_url=arm_faults.url, connection_verify=pki.ca_cert,
                       prices_url=arm_faults.url + "/api/retail/prices")
    [inst] = az.launch(make_offer("azure", "eastus", "Standard_D2s_v5", 0.096), 1, "req-rg", tags={TAG_JOB: "rg"})
    st = azure_fake.app.state
    assert ("sub-1", rg) in st.groups and ("sub-1", rg, "hb-vnet-eastus") in st.vnets
    az.terminate([inst.id], "req-rg")
    assert not [n for n in st.nics.values() if n["tags"].get(TAG_REQUEST) == "req-rg"]


def _body(azure: AzureProvider) -> dict:
    nic = ("/subscriptions/sub-1/resourceGroups/hybrid-broker/providers/Microsoft.Network/networkInterfaces/"
           "strict-nic")
    return azure._vm_body(_offer(azure, Capacity.SPOT), "strict", {TAG_REQUEST: "s"}, nic,
                          make_job("s", command=("true",)))


STRICT = [
    ("no network interface", lambda b: b["properties"].pop("networkProfile"), "InvalidParameter"),
    ("a NIC that does not exist", lambda b: b["properties"]["networkProfile"]["networkInterfaces"][0].update(
        id=b["properties"]["networkProfile"]["networkInterfaces"][0]["id"] + "-x"), "InvalidResourceReference"),
    ("no admin user", lambda b: b["properties"]["osProfile"].pop("adminUsername"), "InvalidParameter"),
    ("neither an SSH key nor a password", lambda b: b["properties"]["osProfile"]["linuxConfiguration"].update(
        ssh={"publicKeys": []}), "InvalidParameter"),
    ("password login without a password", lambda b: b["properties"]["osProfile"].pop("linuxConfiguration"),
     "InvalidParameter"),
    ("custom data that is not base64", lambda b: b["properties"]["osProfile"].update(customData="%%%"),
     "InvalidParameter"),
    ("a spot VM without an eviction policy", lambda b: b["properties"].pop("evictionPolicy"), "InvalidParameter"),
    ("no image", lambda b: b["properties"]["storageProfile"].pop("imageReference"), "InvalidParameter"),
]


@pytest.mark.parametrize(("mutate", "code"), [c[1:] for c in STRICT], ids=[c[0] for c in STRICT])
def test_the_fake_refuses_vm_bodies_arm_refuses(azure: AzureProvider, azure_fake, pki, mutate, code) -> None:
    azure.launch(make_offer("azure", "eastus", "Standard_D2s_v5", 0.096), 1, "req-warm", tags={TAG_JOB: "w"})
    azure.terminate(azure_instances := [i.id for i in azure.instances({TAG_REQUEST: "req-warm"})], "req-warm")
    assert azure_instances  # the group and VNet exist now; make the NIC the body names
    nic_body = {"location": "eastus", "properties": {"ipConfigurations": [{"name": "c", "properties": {
        "subnet": {"id": azure._subnet("eastus")}}}]}}
    base = f"{azure_fake.url}/subscriptions/sub-1/resourceGroups/hybrid-broker/providers"
    httpx.put(f"{base}/Microsoft.Network/networkInterfaces/strict-nic", json=nic_body, verify=pki.ca_cert)
    body = _body(azure)
    mutate(body)
    resp = httpx.put(f"{base}/Microsoft.Compute/virtualMachines/strict", json=body, verify=pki.ca_cert)
    assert resp.status_code in (400, 404) and resp.json()["error"]["code"] == code
    httpx.delete(f"{base}/Microsoft.Network/networkInterfaces/strict-nic", verify=pki.ca_cert)


def test_a_vm_put_in_a_missing_resource_group_is_refused(azure_fake, pki) -> None:
    resp = httpx.put(f"{azure_fake.url}/subscriptions/sub-1/resourceGroups/nope/providers/Microsoft.Compute/"
                     "virtualMachines/x", json={"location": "eastus", "properties": {}}, verify=pki.ca_cert)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "ResourceGroupNotFound"


# -- GPU VMs: the NVIDIA GPU Driver Extension


def test_a_gpu_job_gets_the_nvidia_driver_extension_and_runs_once_the_driver_works(azure: AzureProvider,
                                                                                   azure_fake) -> None:
    req = f"req-{uuid.uuid4().hex[:8]}"
    t4 = next(o for o in azure.offers() if o.instance_type.name == "Standard_NC4as_T4_v3" and o.region == "eastus"
              and o.capacity is Capacity.ON_DEMAND)
    job = make_job("az-gpu", command=("sh", "-c", "nvidia-smi && echo gpu-ok"))
    [inst] = azure.launch(t4, 1, req, tags={TAG_JOB: "az-gpu"}, job=job)
    st = azure_fake.app.state
    vm = st.vms[("sub-1", "hybrid-broker", inst.id)]
    image = vm["properties"]["storageProfile"]["imageReference"]
    assert (image["publisher"], image["sku"]) == ("Canonical", "22_04-lts-gen2"), "the driver is the extension's"
    ext = st.extensions[("sub-1", "hybrid-broker", inst.id, "nvidiagpudriverlinux")]
    assert {k: ext["properties"][k] for k in ("publisher", "type", "typeHandlerVersion", "provisioningState")} == {
        "publisher": "Microsoft.HpcCompute", "type": "NvidiaGpuDriverLinux", "typeHandlerVersion": "1.6",
        "provisioningState": "Succeeded"}
    assert ext["tags"][TAG_REQUEST] == req
    done = wait_done(azure, req)
    assert (done.state, done.exit_code, done.log_tail) == (InstanceState.SUCCEEDED, 0, "NVIDIA-SMI fake\ngpu-ok\n")
    azure.terminate([done.id], req)
    assert inventory(azure_fake, req) == [], "the extension went with its VM"


def test_gpu_driver_image_mode_boots_ubuntu_hpc_without_the_extension(arm_faults: FaultProxy, pki,
                                                                      azure_fake) -> None:
    az = AzureProvider("sub-1", regions=["eastus"], credential=FakeCredential(), base_url=arm_faults.url,
                       connection_verify=pki.ca_cert, prices_url=arm_faults.url + "/api/retail/prices",
                       gpu_driver="image")
    req = f"req-{uuid.uuid4().hex[:8]}"
    t4 = make_offer("azure", "eastus", "Standard_NC4as_T4_v3", 0.526)
    t4 = dataclasses.replace(t4, instance_type=dataclasses.replace(t4.instance_type, gpus=1, accelerator="T4"))
    [inst] = az.launch(t4, 1, req, tags={TAG_JOB: "az-hpc"})
    image = azure_fake.app.state.vms[("sub-1", "hybrid-broker", inst.id)]["properties"]["storageProfile"][
        "imageReference"]
    assert (image["publisher"], image["offer"]) == ("microsoft-dsvm", "ubuntu-hpc")
    assert not [k for k in azure_fake.app.state.extensions if k[2] == inst.id]
    assert not [c for c in arm_faults.calls if "/extensions/" in c.path]
    az.terminate([inst.id], req)
    with pytest.raises(InvalidRequestError, match="extension, image or both"):
        AzureProvider("sub-1", credential=FakeCredential(), gpu_driver="driver")


EXT = {"publisher": "Microsoft.HpcCompute", "type": "NvidiaGpuDriverLinux", "typeHandlerVersion": "1.6",
       "autoUpgradeMinorVersion": True, "settings": {}}
EXT_CASES = [
    ("the documented shape is accepted", "2026-04-01", "vm", {"location": "eastus", "properties": EXT}, 201, None),
    ("no api-version is refused", None, "vm", {"properties": EXT}, 400, "MissingApiVersionParameter"),
    ("an unpublished api-version is refused", "2026-13-01", "vm", {"properties": EXT}, 400,
     "NoRegisteredProviderFound"),
    ("a VM that does not exist is refused", "2026-04-01", "no-such-vm", {"properties": EXT}, 404,
     "ParentResourceNotFound"),
    ("no properties is refused", "2026-04-01", "vm", {"location": "eastus"}, 400, "InvalidParameter"),
    ("no publisher is refused", "2026-04-01", "vm", {"properties": {k: v for k, v in EXT.items() if k != "publisher"}},
     400, "InvalidParameter"),
    ("no typeHandlerVersion is refused", "2026-04-01", "vm",
     {"properties": {k: v for k, v in EXT.items() if k != "typeHandlerVersion"}}, 400, "InvalidParameter"),
    ("settings that are not an object are refused", "2026-04-01", "vm", {"properties": EXT | {"settings": "x"}},
     400, "InvalidParameter"),
    ("an unknown extension type is refused", "2026-04-01", "vm",
     {"properties": EXT | {"type": "NvidiaGpuDriverLinx"}}, 404, "ArtifactNotFound"),
    ("an unknown handler version is refused", "2026-04-01", "vm", {"properties": EXT | {"typeHandlerVersion": "7.0"}},
     404, "ArtifactNotFound"),
    ("another region than the VM's is refused", "2026-04-01", "vm", {"location": "westeurope", "properties": EXT},
     400, "InvalidParameter"),
]


@pytest.mark.parametrize(("version", "vm", "body", "status", "code"), [c[1:] for c in EXT_CASES],
                         ids=[c[0] for c in EXT_CASES])
def test_the_fake_takes_an_extension_put_only_in_the_documented_shape(azure: AzureProvider, azure_fake, pki,
                                                                      version, vm, body, status, code) -> None:
    req = f"req-{uuid.uuid4().hex[:8]}"
    [inst] = azure.launch(_offer(azure), 1, req, tags={TAG_JOB: "az-ext"})
    name = inst.id if vm == "vm" else vm
    try:
        url = (f"{azure_fake.url}/subscriptions/sub-1/resourceGroups/hybrid-broker/providers/Microsoft.Compute/"
               f"virtualMachines/{name}/extensions/NvidiaGpuDriverLinux")
        r = httpx.put(url, params={"api-version": version} if version else {}, json=body, verify=pki.ca_cert)
        assert r.status_code == status, r.text
        if code is not None:
            assert r.json()["error"]["code"] == code
        else:  # accepted on a VM without a GPU: the driver install fails, as on Azure
            assert r.json()["properties"]["provisioningState"] == "Failed"
    finally:
        azure.terminate([inst.id], req)
    assert inventory(azure_fake, req) == []
