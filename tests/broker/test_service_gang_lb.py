"""Gang jobs and load balancing wired into the scheduler, on SQLite and PostgreSQL.

Gangs (``spec.nodes: N``) get all N nodes or none: over on-prem hosts of one site (``sameZone``), as one
cloud launch of N in one zone, or spread over zones (``BROKER_GANG_SPREAD``); a provider that gives fewer
than N, or a part that fails, leaves nothing running. Among options equivalent in total cost the
configured plugin (``BROKER_LOAD_BALANCING``) chooses, from what the store holds (active jobs and
measured runtimes per pool), and the choice is in the job's PLACED event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.clock import ManualClock
from broker.errors import CapacityError, SpecError
from broker.lifecycle import submit_jobs
from broker.model import Capacity, Instance, InstanceType, JobSpec, Location, Offer
from broker.spec import parse_job_spec
from broker.store import JobRow
from policies.placement.topology import interconnect_of
from providers.fake import FakeProvider
from providers.onprem import OnPremPool
from tests.broker.service_support import job_doc, make_app

NS = "default"
_jobs = JobRow.__table__  # type: ignore[attr-defined]

# Three simulated hosts (their runs succeed after durationHours on the clock): two at rack-a, one at rack-b.
HOSTS = [
    {"name": "a1", "site": "rack-a", "vcpus": 4, "memory_gib": 16, "gpus": 0, "owned_usd_per_hour": 0},
    {"name": "a2", "site": "rack-a", "vcpus": 4, "memory_gib": 16, "gpus": 0, "owned_usd_per_hour": 0},
    {"name": "b1", "site": "rack-b", "vcpus": 4, "memory_gib": 16, "gpus": 0, "owned_usd_per_hour": 0},
]
SITES = [{"name": "rack-a", "continent": "eu", "uplink_gbps": 1},
         {"name": "rack-b", "continent": "eu", "uplink_gbps": 1}]
# t3a.medium costs the same in these three AWS regions of the embedded catalog (equivalent pools).
EQUAL_REGIONS = ["us-east-1", "us-east-2", "us-west-2"]


def zone_offer(region: str, zone: str, usd: float, type_name: str = "t3a.medium") -> Offer:
    return Offer(InstanceType(type_name, 2, 4), Location("aws", region, zone), Capacity.ON_DEMAND, usd)


class ShortProvider(FakeProvider):
    """A cloud that answers a launch of N with fewer instances (it made them all, but lost track of one)."""

    def launch(self, offer: Offer, count: int, request_id: str, *, tags: Mapping[str, str],
               job: JobSpec | None = None) -> list[Instance]:
        return super().launch(offer, count, request_id, tags=tags, job=job)[: max(0, count - 1)]


class Harness:
    """An app on ``store_url`` with a manual clock, the three-host on-prem pool and a FakeProvider ``aws``."""

    def __init__(self, tmp_path: Path, store_url: str, *, aws: FakeProvider | None = None, **settings: Any) -> None:
        import pricing

        self.clock = ManualClock()
        path = tmp_path / "inventory-gang.yaml"
        path.write_text(yaml.safe_dump({"sites": SITES, "hosts": HOSTS}))
        self.pool = OnPremPool(pricing.load_inventory(path), tmp_path / "data", clock=self.clock)
        self.aws = aws if aws is not None else FakeProvider("aws")
        self.app = make_app(tmp_path, store_url, providers={"onprem": self.pool, "aws": self.aws},
                            clock=self.clock, inventory=path, **settings)
        self.hb = self.app.state.hb
        self.scheduler = self.hb.scheduler

    def submit(self, *docs: dict[str, Any]) -> list[str]:
        specs = [parse_job_spec(d, now=self.clock.now()) for d in docs]
        with self.hb.store.tx() as session:
            jobs = submit_jobs(session, NS, specs, now=self.clock.now(), spec_docs=[json.dumps(s.raw) for s in specs])
        return [j["id"] for j in jobs]

    def job(self, job_id: str) -> JobRow:
        with self.hb.store.read() as session:
            row = session.get(JobRow, job_id)
            assert row is not None
            return row

    def detail(self, job_id: str) -> dict[str, Any]:
        from broker.api import job_detail

        with self.hb.store.read() as session:
            return job_detail(session, self.job(job_id))

    def placed_event(self, job_id: str) -> dict[str, Any]:
        return next(e for e in self.detail(job_id)["events"] if e["to"] == "PLACED")

    def set_rows(self, job_id: str, **values: Any) -> None:
        with self.hb.store.tx() as session:
            session.connection().execute(_jobs.update().where(_jobs.c.id == job_id).values(**values))

    def close(self) -> None:
        self.hb.store.dispose()


@pytest.fixture
def h(tmp_path: Path, store_url: str) -> Iterator[Harness]:
    harness = Harness(tmp_path, store_url)
    yield harness
    harness.close()


def gang(name: str, nodes: int, *, cpu: str = "2", memory: str = "2Gi", providers: Sequence[str] = ("onprem",),
         regions: Sequence[str] = (), **placement: Any) -> dict[str, Any]:
    pl: dict[str, Any] = {"providers": list(providers), "burstable": "allowed", **placement}  # t3a.medium offers
    if regions:
        pl["regions"] = list(regions)
    return job_doc(name, cpu=cpu, memory=memory, hours=1, nodes=nodes, placement=pl)


def hosts_of(h: Harness, job_id: str) -> list[str]:
    ids = {i["id"] for i in h.detail(job_id)["instances"]}
    return sorted(h.pool._runs[i]["host"] for i in ids)  # noqa: SLF001 - the pool's own record of each run


# ------------------------------------------------------------------------------------------------ gangs


def test_an_on_prem_gang_no_host_holds_goes_over_hosts_of_one_site(h: Harness) -> None:
    (job,) = h.submit(gang("g4", 4, sameZone=True))  # 4 x 2 vCPU: no 4-vCPU host holds it, rack-a does
    h.scheduler.run_cycle()
    row = h.job(job)
    assert row.state == "RUNNING"
    assert hosts_of(h, job) == ["a1", "a1", "a2", "a2"], "all four nodes on rack-a, two per host"
    event = h.placed_event(job)
    assert "gang of 4" in event["reason"]
    assert {(p["instance_type"], p["nodes"]) for p in event["data"]["gang"]} == {("a1", 2), ("a2", 2)}
    tags = {i.tags["hb-request"] for i in h.pool.instances() if i.tags.get("hb-job") == job}
    assert tags == {row.request_id}, "every part carries the job's request id (reconciliation finds them)"
    assert [e["to"] for e in h.detail(job)["events"]][-1] == "RUNNING"


def test_a_second_gang_that_fits_nowhere_whole_waits_and_launches_nothing(h: Harness) -> None:
    first, second = h.submit(gang("g4", 4, sameZone=True), gang("g3", 3, sameZone=True))
    h.scheduler.run_cycle()
    assert h.job(first).state == "RUNNING"
    assert h.job(second).state == "PENDING", "rack-b holds 2 of 3 nodes: the gang waits instead of a part"
    assert not [i for i in h.pool.instances() if i.tags.get("hb-job") == second]
    assert h.job(second).held_reason


@pytest.mark.parametrize(("policy", "want"), [
    ("pack", ["a1", "a1"]),  # both nodes on the cheapest host that holds them
    ("spread", ["a1", "b1"]),  # one node per site (zone) in turn
], ids=["pack keeps a gang together", "spread puts one node per site"])
def test_gang_layout_follows_the_configured_policy(tmp_path: Path, store_url: str, policy: str,
                                                   want: list[str]) -> None:
    h = Harness(tmp_path, store_url, gang_spread=policy)
    try:
        assert h.scheduler.gang_policy == policy
        (job,) = h.submit(gang("g2", 2))
        h.scheduler.run_cycle()
        assert h.job(job).state == "RUNNING"
        assert hosts_of(h, job) == want
    finally:
        h.close()


def test_a_same_zone_cloud_gang_is_one_launch_of_n_in_the_cheapest_zone(tmp_path: Path, store_url: str) -> None:
    aws = FakeProvider("aws", offers=[zone_offer("us-east-1", "us-east-1a", 0.040),
                                      zone_offer("us-east-1", "us-east-1b", 0.035)])
    h = Harness(tmp_path, store_url, aws=aws)
    try:
        (job,) = h.submit(gang("c3", 3, providers=["aws"], regions=["us-east-1"], memory="4Gi", sameZone=True))
        h.scheduler.run_cycle()
        assert h.job(job).state == "RUNNING"
        assert [(o.location.zone, n) for o, n, _ in aws.launch_calls] == [("us-east-1b", 3)]
        assert {i.zone for i in aws.running()} == {"us-east-1b"} and len(aws.running()) == 3
        assert h.detail(job)["placement"]["zone"] == "us-east-1b"
        assert "one zone" in h.placed_event(job)["reason"]
    finally:
        h.close()


def test_a_same_zone_cloud_gang_with_no_known_zone_fails_with_the_reason(h: Harness) -> None:
    (job,) = h.submit(gang("c3", 3, providers=["aws"], regions=["us-east-1"], memory="4Gi", sameZone=True))
    h.scheduler.run_cycle()
    row = h.job(job)
    assert row.state == "FAILED"
    assert row.message and row.message.startswith("GangUnschedulable") and "sameZone" in row.message
    assert h.aws.launch_calls == []


def test_a_spread_cloud_gang_is_one_launch_per_zone(tmp_path: Path, store_url: str) -> None:
    aws = FakeProvider("aws", offers=[zone_offer("us-east-1", z, 0.0376) for z in ("us-east-1a", "us-east-1b")])
    h = Harness(tmp_path, store_url, aws=aws, gang_spread="spread")
    try:
        (job,) = h.submit(gang("c4", 4, providers=["aws"], regions=["us-east-1"], memory="4Gi"))
        h.scheduler.run_cycle()
        row = h.job(job)
        assert row.state == "RUNNING"
        assert sorted((o.location.zone, n) for o, n, _ in aws.launch_calls) == [("us-east-1a", 2), ("us-east-1b", 2)]
        assert {i.tags["hb-request"] for i in aws.running()} == {row.request_id}
        assert len(h.detail(job)["instances"]) == 4
    finally:
        h.close()


def test_a_part_failing_mid_gang_terminates_the_parts_launched_and_backs_off(tmp_path: Path,
                                                                              store_url: str) -> None:
    aws = FakeProvider("aws", offers=[zone_offer("us-east-1", z, 0.0376) for z in ("us-east-1a", "us-east-1b")],
                       fail=[None, CapacityError("no capacity in us-east-1b")])
    h = Harness(tmp_path, store_url, aws=aws, gang_spread="spread")
    try:
        (job,) = h.submit(gang("c4", 4, providers=["aws"], regions=["us-east-1"], memory="4Gi"))
        report = h.scheduler.run_cycle()
        assert report.backoff == 1 and h.job(job).state == "BACKOFF"
        assert len(aws.launch_calls) == 2 and len(aws.terminated) == 2, "the first zone's 2 nodes were launched"
        assert aws.running() == [], "nothing of the gang is left running"
        outcomes = [a["outcome"] for a in h.detail(job)["attempts"]]
        assert outcomes == ["launched", "capacity"]
    finally:
        h.close()


def test_a_provider_giving_fewer_than_n_leaves_no_partial_gang(tmp_path: Path, store_url: str) -> None:
    aws = ShortProvider("aws")
    h = Harness(tmp_path, store_url, aws=aws)
    try:
        (job,) = h.submit(gang("c3", 3, providers=["aws"], regions=["us-east-1"], memory="4Gi"))
        h.scheduler.run_cycle()
        row = h.job(job)
        assert row.state == "BACKOFF"
        assert row.message and "GangUnschedulable" in row.message and "2 of 3" in row.message
        assert aws.running() == [] and len(aws.terminated) == 3, "the two returned and the one lost"
    finally:
        h.close()


def test_an_interconnect_gang_runs_on_nvlink_types_end_to_end(h: Harness) -> None:
    doc = job_doc("nv", cpu="8", memory="32Gi", hours=1, nodes=2,
                  resources={"requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "8"}},
                  placement={"providers": ["aws"], "interconnect": "nvlink"})
    (job,) = h.submit(doc)
    h.scheduler.run_cycle()
    assert h.job(job).state == "RUNNING"
    ((offer, count, _),) = h.aws.launch_calls
    assert count == 2
    assert interconnect_of(offer.instance_type.name) in ("nvlink", "nvswitch")


# ------------------------------------------------------------------------------------------ load balancing


def cloud_job(name: str, regions: Sequence[str] = EQUAL_REGIONS) -> dict[str, Any]:
    # t3a.medium is burstable: whole-vCPU jobs take it only when they allow it (issue 12)
    return job_doc(name, cpu="2", memory="4Gi", hours=1,
                   placement={"providers": ["aws"], "regions": list(regions), "burstable": "allowed"})


def test_least_loaded_spreads_equivalent_regions_within_a_cycle(h: Harness) -> None:
    ids = h.submit(*[cloud_job(f"lb-{i}") for i in range(3)])
    h.scheduler.run_cycle()
    assert sorted(str(h.job(i).region) for i in ids) == sorted(EQUAL_REGIONS)
    event = h.placed_event(ids[1])
    assert "load balancing (least-loaded) among 3 options" in event["reason"]
    assert event["data"]["load_balancing"]["chosen"] == f"aws:{h.job(ids[1]).region}"


def test_least_loaded_reads_active_jobs_from_the_store_after_a_restart(h: Harness) -> None:
    from broker.scheduler import Scheduler

    (first,) = h.submit(cloud_job("lb-0"))
    h.scheduler.run_cycle()
    assert h.job(first).region == "us-east-1", "equal scores keep the placement's rank order"
    restarted = Scheduler(h.hb)  # nothing in memory: the running job is only in the store
    (second,) = h.submit(cloud_job("lb-1"))
    restarted.run_cycle()
    assert h.job(second).region == "us-east-2"
    assert h.placed_event(second)["data"]["load_balancing"]["active"]["aws:us-east-1"] == 1


def test_round_robin_takes_equivalent_pools_in_turn(tmp_path: Path, store_url: str) -> None:
    h = Harness(tmp_path, store_url, load_balancing="round-robin")
    try:
        regions = []
        for i in range(4):
            (job,) = h.submit(cloud_job(f"rr-{i}"))
            h.scheduler.run_cycle()
            regions.append(h.job(job).region)
        assert regions == ["us-east-1", "us-east-2", "us-west-2", "us-east-1"]
    finally:
        h.close()


def _history(h: Harness, region: str, hours: Sequence[float], *, state: str = "SUCCEEDED") -> None:
    """Jobs of the past in ``region``: SUCCEEDED after ``hours`` each (or active, with ``state=RUNNING``)."""
    ids = h.submit(*[cloud_job(f"past-{region}-{i}") for i in range(len(hours))])
    end = h.clock.now() - timedelta(hours=1)
    for job_id, took in zip(ids, hours, strict=True):
        h.set_rows(job_id, state=state, provider="aws", region=region, started_at=end - timedelta(hours=took),
                   finished_at=end if state == "SUCCEEDED" else None)


@pytest.mark.parametrize(("plugin", "want"), [
    ("none", "us-east-1"),  # no balancing: the placement's first option
    ("least-loaded", "us-east-2"),  # us-east-1 has 2 active jobs; us-east-2 ranks before us-west-2
    ("performance", "us-west-2"),  # the fastest measured runtimes
    ("predictive", "us-west-2"),  # shortest predicted completion
    ("round-robin", "us-east-1"),  # first turn: the first pool by name
    ("least-loaded:1,performance:2", "us-west-2"),
], ids=lambda v: str(v))
def test_the_configured_plugin_chooses_from_the_history_in_the_store(tmp_path: Path, store_url: str, plugin: str,
                                                                     want: str) -> None:
    h = Harness(tmp_path, store_url, load_balancing=plugin)
    try:
        _history(h, "us-east-1", [1.0, 1.0], state="RUNNING")
        _history(h, "us-east-1", [2.0, 2.0])
        _history(h, "us-east-2", [1.0, 1.5])
        _history(h, "us-west-2", [0.5, 0.5])
        (job,) = h.submit(cloud_job("pick"))
        h.scheduler.run_cycle()
        assert h.job(job).region == want
        data = h.placed_event(job).get("data", {})
        if plugin == "none":
            assert "load_balancing" not in data
        else:
            assert data["load_balancing"]["chosen"] == f"aws:{want}"
    finally:
        h.close()


@pytest.mark.parametrize(("tolerance", "want"), [(None, "ap-south-1"), ("0.6", "us-east-1")],
                         ids=["1% keeps the cheaper region", "60% makes them equivalent"])
def test_the_tolerance_decides_what_counts_as_equivalent(tmp_path: Path, store_url: str, tolerance: str | None,
                                                         want: str) -> None:
    # t3a.medium: ap-south-1 $0.0246/h, us-east-1 $0.0376/h (53% more); ap-south-1 already has an active job
    extra: dict[str, Any] = {} if tolerance is None else {"load_balancing_tolerance": float(tolerance)}
    h = Harness(tmp_path, store_url, **extra)
    try:
        _history(h, "ap-south-1", [1.0], state="RUNNING")
        (job,) = h.submit(cloud_job("tol", regions=["ap-south-1", "us-east-1"]))
        h.scheduler.run_cycle()
        assert h.job(job).region == want
    finally:
        h.close()


# ------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(("env", "field", "value"), [
    ({}, "gang_spread", "pack"),
    ({}, "load_balancing_weights", {"least-loaded": 1.0}),
    ({}, "load_balancing_tolerance", 0.01),
    ({"BROKER_GANG_SPREAD": "Spread"}, "gang_spread", "spread"),
    ({"BROKER_LOAD_BALANCING": "none"}, "load_balancing_weights", {}),
    ({"BROKER_LOAD_BALANCING": "least-loaded:1, performance:2"}, "load_balancing_weights",
     {"least-loaded": 1.0, "performance": 2.0}),
    ({"BROKER_LOAD_BALANCING_TOLERANCE": "2.5%"}, "load_balancing_tolerance", 0.025),
    ({"BROKER_LOAD_BALANCING_TOLERANCE": "0"}, "load_balancing_tolerance", 0.0),
], ids=lambda v: str(v))
def test_settings_read_the_gang_and_load_balancing_keys(tmp_path: Path, env: dict[str, str], field: str,
                                                        value: Any) -> None:
    from broker.config import load_settings

    settings = load_settings({"BROKER_DATA_DIR": str(tmp_path), **env})
    assert getattr(settings, field) == value


@pytest.mark.parametrize(("key", "raw", "says"), [
    ("BROKER_GANG_SPREAD", "diagonal", "pack, spread"),
    ("BROKER_LOAD_BALANCING", "fastest", "least-loaded"),
    ("BROKER_LOAD_BALANCING", "performance:x", "not a number"),
    ("BROKER_LOAD_BALANCING_TOLERANCE", "2", "[0, 1)"),
    ("BROKER_LOAD_BALANCING_TOLERANCE", "lots", "0.01"),
], ids=lambda v: str(v))
def test_bad_gang_and_load_balancing_values_name_the_key(tmp_path: Path, key: str, raw: str, says: str) -> None:
    from broker.config import load_settings

    with pytest.raises(SpecError) as info:
        load_settings({"BROKER_DATA_DIR": str(tmp_path), key: raw})
    assert info.value.field == key and says in str(info.value) and "To fix" in str(info.value)

