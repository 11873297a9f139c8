"""The broker runs command jobs on each cloud end to end: the API takes the job, the scheduler places and
launches it through the real adapter against a server-mode fake (moto for AWS, the strict HTTPS fakes for
Azure and GCP), the VM runs the script the adapter sent (a guest subprocess), the scheduler reads the exit
code and log tail back, ``jobs logs`` shows it, and the fake's inventory ends empty.

moto cannot run user data, so :class:`Ec2Guests` plays EC2's part: it boots every instance's user data in a
:class:`tests.providers.guest.Guest` and, when the script powers the VM off, terminates the instance in moto
(instance-initiated shutdown ``terminate``) and serves what the script wrote on its console through
``GetConsoleOutput`` (a fault-proxy reply), which is what EC2 itself would answer."""

from __future__ import annotations

import base64
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from broker.clock import ManualClock, utcnow
from broker.model import Capacity, InstanceType, Location, Offer, Provenance, RetryPolicy
from providers.aws import AwsProvider
from providers.azure import AzureProvider
from providers.base import TAG_REQUEST
from providers.failover import Blocklist, backoff_delay
from providers.gcp import GcpProvider, gce_label
from tests.broker.service_support import serve_in_thread

from . import faultproxy
from .conftest import GCP_PROJECT, FakeCredential
from .faultproxy import (
    FaultProxy,
    arm_error,
    ec2_action,
    ec2_call,
    ec2_console_output,
    ec2_error,
    gce_error,
    request,
)
from .guest import Guest

pytestmark = pytest.mark.network

ADMIN = "hb_admin_provider_jobs"
H = {"Authorization": f"Bearer {ADMIN}"}


def offer(provider: str, region: str, name: str, usd: float, capacity: Capacity = Capacity.ON_DEMAND,
          vcpus: float = 2, mem: float = 8) -> Offer:
    return Offer(InstanceType(name, vcpus, mem), Location(provider, region, None), capacity, usd, "test")


class Ec2Guests:
    """EC2's guest side for moto (see the module docstring)."""

    def __init__(self, moto_endpoint: str, faults: FaultProxy) -> None:
        self.ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1",
                                aws_access_key_id="testing", aws_secret_access_key="testing")
        self.faults = faults
        self.clients = {r: boto3.client("ec2", endpoint_url=moto_endpoint, region_name=r,
                                        aws_access_key_id="testing", aws_secret_access_key="testing")
                        for r in ("us-east-1", "us-west-2")}
        self.guests: dict[str, Guest] = {}
        self._lock = threading.Lock()

    def step(self) -> None:
        for region in ("us-east-1", "us-west-2"):
            ec2 = self.clients[region]
            for res in ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": [TAG_REQUEST]},
                                                       {"Name": "instance-state-name",
                                                        "Values": ["pending", "running"]}])["Reservations"]:
                for inst in res["Instances"]:
                    iid = inst["InstanceId"]
                    with self._lock:
                        if iid in self.guests:
                            continue
                        raw = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
                        data = (raw.get("UserData") or {}).get("Value")
                        script = base64.b64decode(data).decode() if data else None
                        guest = Guest(script, self._poweroff(ec2, iid))
                        self.guests[iid] = guest
                    guest.boot()

    def _poweroff(self, ec2: Any, iid: str) -> Callable[[], None]:
        def off() -> None:
            text = self.guests[iid].console()
            self.faults.add(ec2_call("GetConsoleOutput", InstanceId=iid), ec2_console_output(iid, text), times=-1)
            ec2.terminate_instances(InstanceIds=[iid])  # instance-initiated shutdown behaviour: terminate

        return off

    def preempt(self, iid: str, ec2: Any) -> None:
        self.guests[iid].kill()
        ec2.terminate_instances(InstanceIds=[iid])  # reclaimed: no report on the console

    def close(self) -> None:
        for g in self.guests.values():
            g.cleanup()


@dataclass
class Cloud:
    """One cloud wired into a broker app: ``inventory(job_id)`` is what its fake still holds for the job,
    ``preempt(instance_id)`` reclaims a spot VM, ``step()`` runs between scheduler cycles."""

    name: str
    provider: Any
    offers: list[Offer]
    inventory: Callable[[], list[str]]
    preempt: Callable[[str], None]
    capacity_fault: Callable[[], None]
    step: Callable[[], None] = lambda: None
    regions: tuple[str, str] = ("", "")
    extra: dict[str, Any] = field(default_factory=dict)
    throttle: Callable[[int], None] = lambda times: None  # the next ``times`` launch calls are throttled


@pytest.fixture(scope="module")
def aws_cloud(aws_proxy: FaultProxy, moto_endpoint: str) -> Iterator[Cloud]:
    ec2_faults = aws_proxy
    aws = AwsProvider(["us-east-1", "us-west-2"], endpoint_url=ec2_faults.url, access_key="testing",
                      secret_key="testing")
    guests = Ec2Guests(moto_endpoint, ec2_faults)
    mine: set[str] = set()
    volumes_before = {r: {v["VolumeId"] for v in guests.clients[r].describe_volumes()["Volumes"]}
                      for r in ("us-east-1", "us-west-2")}

    def inventory() -> list[str]:
        """Our instances not terminated, and EBS volumes made since the module began (root volumes go with
        their instance). Primary ENIs are not counted: moto keeps a terminated instance's ENI, EC2 deletes it."""
        out = []
        for region in ("us-east-1", "us-west-2"):
            ec2 = guests.clients[region]
            for res in ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": [TAG_REQUEST]}])["Reservations"]:
                out += [i["InstanceId"] for i in res["Instances"] if i["State"]["Name"] not in ("terminated",)
                        and i["InstanceId"] in mine]
            out += [f"volume {v['VolumeId']}" for v in ec2.describe_volumes()["Volumes"]
                    if v["VolumeId"] not in volumes_before[region]]
        return out

    def step() -> None:
        guests.step()
        mine.update(guests.guests)

    def preempt(iid: str) -> None:
        guests.preempt(iid, guests.ec2)

    def capacity() -> None:
        ec2_faults.add(ec2_action("RunInstances"), ec2_error("InsufficientInstanceCapacity", status=500))

    def throttle(times: int) -> None:  # EC2's throttling answer: 503 RequestLimitExceeded, Retry-After 1
        ec2_faults.add(ec2_action("RunInstances"), faultproxy.throttle(retry_after=1, json_body=False), times)

    yield Cloud("aws", aws, [offer("aws", "us-east-1", "m5.large", 0.096),
                             offer("aws", "us-east-1", "m5.large", 0.03, Capacity.SPOT),
                             offer("aws", "us-west-2", "m5.large", 0.099)],
                inventory, preempt, capacity, step, ("us-east-1", "us-west-2"), throttle=throttle)
    guests.close()


@pytest.fixture(scope="module")
def azure_cloud(azure_proxy: FaultProxy, pki, azure_fake) -> Iterator[Cloud]:
    arm_faults = azure_proxy
    az = AzureProvider("sub-1", regions=["eastus", "westeurope"], resource_group="hb-jobs",
                       credential=FakeCredential(), base_url=arm_faults.url, connection_verify=pki.ca_cert,
                       prices_url=arm_faults.url + "/api/retail/prices")
    st = azure_fake.app.state

    def inventory() -> list[str]:
        vms = [f"vm {v['name']}" for (_, g, _), v in st.vms.items() if g == "hb-jobs"]
        nics = [f"nic {n['name']}" for (_, g, _), n in st.nics.items() if g == "hb-jobs"]
        disks = [f"disk {d['name']}" for (_, g, _), d in st.disks.items() if g == "hb-jobs"]
        exts = [f"extension {vm}/{e['name']}" for (_, g, vm, _), e in st.extensions.items() if g == "hb-jobs"]
        return vms + nics + disks + exts

    def capacity() -> None:
        arm_faults.add(request("PUT", "/virtualMachines/"), arm_error("AllocationFailed"))

    def throttle(times: int) -> None:  # ARM's throttling answer: 429 TooManyRequests, Retry-After 1
        arm_faults.add(request("PUT", "/virtualMachines/"), faultproxy.throttle(retry_after=1), times)

    yield Cloud("azure", az, [offer("azure", "eastus", "Standard_D2s_v5", 0.096),
                              offer("azure", "eastus", "Standard_D2s_v5", 0.02, Capacity.SPOT),
                              offer("azure", "westeurope", "Standard_D2s_v5", 0.1056)],
                inventory, st.evict, capacity, regions=("eastus", "westeurope"), throttle=throttle)


@pytest.fixture(scope="module")
def gcp_cloud(gcp_proxy: FaultProxy, gcp_fake, gcp_creds: dict[str, str], pki) -> Iterator[Cloud]:
    gcp_proxy.clear()
    gcp = GcpProvider(GCP_PROJECT, zones=["us-central1-a", "us-central1-b", "europe-west1-b"],
                      credentials_file=gcp_creds["key"], endpoint=gcp_proxy.url, billing_url=gcp_proxy.url,
                      ca_bundle=pki.ca_cert, token_cache=gcp_creds["token"], poll_interval_seconds=0)
    st = gcp_fake.app.state
    before = set(st.disks)
    mine: set[str] = set()

    def inventory() -> list[str]:
        jobs = {gce_label(j) for j in mine}
        out = [f"vm {z}/{n}" for (z, n), i in st.instances.items() if (i.get("labels") or {}).get("hb-job") in jobs]
        return out + [f"disk {z}/{n}" for (z, n) in st.disks if (z, n) not in before]

    def capacity() -> None:
        for z in ("us-central1-a", "us-central1-b"):
            st.exhausted.add((z, "n2-standard-4"))

    cloud = Cloud("gcp", gcp, [offer("gcp", "us-central1", "n2-standard-4", 0.19, vcpus=4, mem=16),
                               offer("gcp", "us-central1", "n2-standard-4", 0.05, Capacity.SPOT, vcpus=4, mem=16),
                               offer("gcp", "europe-west1", "n2-standard-4", 0.21, vcpus=4, mem=16)],
                  inventory, lambda iid: st.preempt(*iid.split("/")), capacity,
                  regions=("us-central1", "europe-west1"),
                  throttle=lambda times: gcp_proxy.add(request("POST", "/instances"),  # GCE: 403 rateLimitExceeded
                                                       gce_error("rateLimitExceeded", "Rate Limit Exceeded"), times))
    cloud.extra["mine"] = mine
    yield cloud
    st.exhausted.clear()
    gcp_proxy.clear()


class Broker:
    """A broker app with one cloud provider, its offers as the catalog, a SQLite store and the API client."""

    def __init__(self, tmp_path: Path, cloud: Cloud) -> None:
        import pricing
        from broker.app import create_app
        from broker.config import load_settings
        from pricing.catalog import Catalog

        settings = load_settings({}, data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path}/b.db",
                                 admin_token=ADMIN, scheduler_enabled=False, providers=(cloud.name,),
                                 # every retry of SPEC_RETRY slept in the cycle, on every option (the default
                                 # budget, 10 s per job, is tested in test_providers_failover.py)
                                 launch_retry_wait_seconds=60)
        catalog = Catalog.from_offers(cloud.offers, Provenance("test", "2026-12-01", provider=cloud.name))
        self.cloud = cloud
        self.app = create_app(settings, providers={cloud.name: cloud.provider}, catalog=catalog,
                              egress=pricing.load_egress(None))
        self.hb = self.app.state.hb
        self._served = serve_in_thread(self.app)
        self.http = httpx.Client(base_url=self._served.__enter__(), timeout=30)

    def submit(self, name: str, command: list[str], **spec: Any) -> str:
        body = {"command": command, "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}, "durationHours": 0.1,
                "placement": {"providers": [self.cloud.name], "spot": "never"},
                "retry": {"backoffLimit": 0, "retryDelaySeconds": 0, "maxRetryDelaySeconds": 0}} | spec
        doc = {"apiVersion": "hybrid-broker/v1", "kind": "Job", "metadata": {"name": name}, "spec": body}
        r = self.http.post("/v1/namespaces/default/jobs", json=doc, headers=H)
        assert r.status_code == 201, r.text
        job_id = str(r.json()["id"])
        self.cloud.extra.setdefault("mine", set()).add(job_id)
        return job_id

    def get(self, job_id: str) -> dict[str, Any]:
        return self.http.get(f"/v1/namespaces/default/jobs/{job_id}", headers=H).json()

    def until(self, job_id: str, states: set[str], timeout: float = 40.0) -> dict[str, Any]:
        """Scheduler cycles (and the guest side) until the job is in one of ``states``; bounded."""
        deadline = time.monotonic() + timeout
        while True:
            self.hb.scheduler.run_cycle()
            self.cloud.step()
            job = self.get(job_id)
            if job["state"] in states:
                return job
            assert time.monotonic() < deadline, f"job still {job['state']}: {job.get('message')}"
            time.sleep(0.05)

    def logs(self, job_id: str) -> str:
        r = self.http.get(f"/v1/namespaces/default/jobs/{job_id}/logs", headers=H)
        assert r.status_code == 200, r.text
        return r.text

    def close(self) -> None:
        self.http.close()
        self._served.__exit__(None, None, None)
        self.hb.store.dispose()


CLOUDS = ["aws", "azure", "gcp"]


@pytest.fixture(scope="module", params=CLOUDS)
def module_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker app per cloud for the module (building an app migrates a store: seconds)."""
    cloud: Cloud = request.getfixturevalue(f"{request.param}_cloud")
    b = Broker(tmp_path_factory.mktemp(f"broker-{request.param}"), cloud)
    yield b
    b.close()


@pytest.fixture
def broker(module_broker: Broker, aws_proxy: FaultProxy, azure_proxy: FaultProxy, gcp_proxy: FaultProxy,
           gcp_fake) -> Iterator[Broker]:
    """The module's broker with no fault left from an earlier test."""
    for proxy in (azure_proxy, gcp_proxy):
        proxy.clear()
    aws_proxy.clear()
    gcp_fake.app.state.exhausted.clear()
    yield module_broker
    gcp_fake.app.state.exhausted.clear()


def test_a_command_job_succeeds_with_its_exit_code_and_log_tail(broker: Broker, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    job = broker.submit("ok", ["sh", "-c", "echo step 1; echo done on $HB_CLOUD"], env={"HB_CLOUD": broker.cloud.name})
    done = broker.until(job, {"SUCCEEDED", "FAILED"})
    assert (done["state"], done["exit_code"]) == ("SUCCEEDED", 0), done.get("message")
    assert broker.logs(job) == f"step 1\ndone on {broker.cloud.name}\n"
    from broker.cli import main  # `broker jobs logs` shows the same tail

    monkeypatch.setenv("BROKER_URL", str(broker.http.base_url).rstrip("/"))
    monkeypatch.setenv("BROKER_TOKEN", ADMIN)
    with pytest.raises(SystemExit) as exc:
        main(["jobs", "logs", job, "-n", "default"])
    assert exc.value.code in (0, None) and capsys.readouterr().out == f"step 1\ndone on {broker.cloud.name}\n"
    broker.until(job, {"SUCCEEDED"})  # one more cycle: the stopped VM was deleted after its report
    assert broker.cloud.inventory() == []


def test_a_failing_command_fails_with_its_code(broker: Broker) -> None:
    job = broker.submit("bad", ["sh", "-c", "echo no such file >&2; exit 3"])
    done = broker.until(job, {"SUCCEEDED", "FAILED"})
    assert (done["state"], done["exit_code"]) == ("FAILED", 3)
    assert "no such file" in broker.logs(job)
    assert broker.cloud.inventory() == []


def test_a_cancelled_job_leaves_nothing(broker: Broker) -> None:
    job = broker.submit("long", ["sleep", "30"])
    broker.until(job, {"RUNNING"})
    assert broker.cloud.inventory() != []
    assert broker.http.delete(f"/v1/namespaces/default/jobs/{job}", headers=H).status_code == 200
    assert broker.get(job)["state"] == "CANCELLED" and broker.cloud.inventory() == []


def test_a_preempted_spot_job_is_placed_again_and_the_reclaimed_vm_is_deleted(broker: Broker) -> None:
    job = broker.submit("spot", ["sleep", "30"], placement={"providers": [broker.cloud.name], "spot": "required"},
                        retry={"backoffLimit": 2, "retryDelaySeconds": 0, "maxRetryDelaySeconds": 0})
    first = broker.until(job, {"RUNNING"})
    [iid] = [i["id"] for i in first["instances"]]
    broker.cloud.step()
    broker.cloud.preempt(iid)
    again = broker.until(job, {"BACKOFF", "PENDING", "PLACED", "PROVISIONING"})
    assert again["retries"] == 1
    second = broker.until(job, {"RUNNING"})
    assert [i["id"] for i in second["instances"]] != [iid]
    assert broker.http.delete(f"/v1/namespaces/default/jobs/{job}", headers=H).status_code == 200
    assert broker.cloud.inventory() == []


def test_a_capacity_error_fails_over_to_the_next_region(broker: Broker) -> None:
    broker.cloud.capacity_fault()
    job = broker.submit("fo", ["true"])
    done = broker.until(job, {"SUCCEEDED", "FAILED"})
    assert (done["state"], done["region"]) == ("SUCCEEDED", broker.cloud.regions[1]), done.get("message")
    broker.until(job, {"SUCCEEDED"})
    assert broker.cloud.inventory() == []


SPEC_RETRY = {"backoffLimit": 2, "retryDelaySeconds": 4, "maxRetryDelaySeconds": 6}


@pytest.fixture
def manual_cycle(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    """The scheduler of ``broker`` on a manual clock (and a blocklist on it), its jitter seeded: the in-cycle
    retries sleep on it, so their delays are exact and nothing really waits."""
    clock = ManualClock(utcnow())
    monkeypatch.setattr(broker.hb.scheduler, "clock", clock)
    monkeypatch.setattr(broker.hb.scheduler, "blocklist", Blocklist(clock))
    broker.hb.scheduler.rng.seed(5)
    return clock


def test_a_throttled_launch_backs_off_per_the_spec_then_fails_over(broker: Broker, manual_cycle: ManualClock) -> None:
    broker.cloud.throttle(3)  # the first option's first try and its backoffLimit=2 retries
    job = broker.submit("thr", ["true"], retry=SPEC_RETRY)
    done = broker.until(job, {"SUCCEEDED", "FAILED"})
    assert (done["state"], done["region"]) == ("SUCCEEDED", broker.cloud.regions[1]), done.get("message")
    assert [a["outcome"] for a in done["attempts"]] == ["transient"] * 3 + ["launched"]
    assert {a["region"] for a in done["attempts"][:3]} == {broker.cloud.regions[0]}
    rng = random.Random(5)
    delays = [backoff_delay(RetryPolicy(2, 4, 6), n, rng) for n in range(2)]  # 4 then min(6, 8), with jitter
    assert manual_cycle.sleeps == delays and 2 <= delays[0] <= 4 and 3 <= delays[1] <= 6
    assert [a["delay_seconds"] for a in done["attempts"]] == [*delays, 0.0, 0.0]
    broker.until(job, {"SUCCEEDED"})
    assert broker.cloud.inventory() == []


def test_a_launch_throttled_everywhere_fails_the_job_saying_why(broker: Broker, manual_cycle: ManualClock) -> None:
    broker.cloud.throttle(-1)
    job = broker.submit("thr-all", ["true"], retry=SPEC_RETRY)
    done = broker.until(job, {"SUCCEEDED", "FAILED", "BACKOFF"})
    assert done["state"] == "FAILED" and done["retries"] == 0, "failed in its first cycle, not backed off"
    assert [a["outcome"] for a in done["attempts"]] == ["transient"] * 6  # 2 options x (1 try + 2 retries)
    assert len(manual_cycle.sleeps) == 4
    msg = done["message"]
    assert msg.startswith(f"every placement option failed (2 tried): {broker.cloud.name}:{broker.cloud.regions[0]}")
    assert msg.count("3 transient errors") == 2 and "gave up after 2 retries" in msg
    assert broker.cloud.inventory() == []


def test_a_command_job_is_refused_where_nothing_can_run_it(tmp_path: Path) -> None:
    from providers.base import Capability
    from providers.fake import FakeProvider

    cloud = Cloud("aws", FakeProvider("aws", capabilities=frozenset({Capability.TAGS})),
                  [offer("aws", "us-east-1", "m5.large", 0.096)], list, lambda i: None, lambda: None)
    b = Broker(tmp_path, cloud)
    try:
        job = b.submit("nowhere", ["true"])
        done = b.until(job, {"FAILED"})
        assert "runs-work" in done["message"] and cloud.provider.launch_calls == []
    finally:
        b.close()



def test_a_dry_run_job_ends_flagged_as_simulated(tmp_path: Path) -> None:
    from broker.clock import ManualClock
    from providers.dryrun import DryRunProvider

    clock = ManualClock()
    dry = DryRunProvider("azure", clock=clock)
    cloud = Cloud("azure", dry, [offer("azure", "eastus", "Standard_D2s_v5", 0.096)], list, lambda i: None,
                  lambda: None, step=lambda: clock.advance(3600))
    b = Broker(tmp_path, cloud)
    try:
        job = b.submit("sim", ["python", "train.py"])
        done = b.until(job, {"SUCCEEDED", "FAILED"})
        assert done["state"] == "SUCCEEDED" and done["dry_run"] is True
        end = done["events"][-1]
        assert "simulated" in end["reason"] and end["data"]["dry_run"] is True
        assert end["data"]["simulated_usd"] >= 0
    finally:
        b.close()


def test_concurrent_launch_waves_run_each_job_once_and_leave_nothing(broker: Broker) -> None:
    """``BROKER_SCHEDULER_LAUNCH_CONCURRENCY`` 4: one cycle launches its jobs in waves of 4 at once through the
    cloud's real SDK; each job gets one instance, runs once, succeeds, and nothing is left."""
    sched = broker.hb.scheduler
    before = sched.launch_concurrency
    sched.launch_concurrency = 4
    try:
        jobs = [broker.submit(f"wave-{i}", ["sh", "-c", f"echo job {i}"]) for i in range(6)]
        for job in jobs:
            done = broker.until(job, {"SUCCEEDED", "FAILED"}, timeout=90.0)
            assert (done["state"], done["exit_code"]) == ("SUCCEEDED", 0), done.get("message")
        for i, job in enumerate(jobs):
            got = broker.get(job)
            moves = [(e["from"], e["to"]) for e in got["events"] if e["from"] != e["to"]]
            assert moves.count(("PROVISIONING", "RUNNING")) == 1 and len(got["instances"]) == 1, moves
            assert broker.logs(job) == f"job {i}\n"
        broker.until(jobs[-1], {"SUCCEEDED"})  # one more cycle: stopped VMs deleted after their reports
        assert broker.cloud.inventory() == []
    finally:
        sched.launch_concurrency = before
