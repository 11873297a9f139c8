"""Edge devices inside the broker service: placement on devices, task outcomes moving jobs, and the whole
way through real parts (Mosquitto with mTLS from the generated config, the broker under uvicorn, agents
enrolled over HTTP and running as processes).

The placement and outcome tables run on SQLite and PostgreSQL with a manual clock and a gateway that is
built but never connected (its dispatches are recorded in the store, as always). The end-to-end tests run
on SQLite with the system clock and short gateway timeouts.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from broker import devices
from broker.clock import ManualClock
from broker.edge_provider import EdgeService, job_of_request, parse_mqtt_url
from broker.errors import SpecError
from broker.lifecycle import submit_jobs
from broker.model import JobState
from broker.spec import parse_job_spec
from broker.store import JobEventRow, JobRow
from edge import pki, protocol
from providers.fake import FakeProvider
from tests.broker.service_support import ADMIN_H, catalog, make_settings, serve_in_thread
from tests.edge.conftest import MOSQUITTO, AgentProcess, Mosquitto, free_port, wait_port, wait_until

NS = "default"


def make_app(tmp_path: Path, store_url: str, *, providers: dict[str, Any], clock: Any = None,
             gateway_options: dict[str, Any] | None = None, **overrides: Any) -> Any:
    """A broker app like ``tests.broker.service_support.make_app``, plus ``gateway_options``."""
    import pricing
    from broker.app import create_app

    settings = make_settings(tmp_path, store_url, **overrides)
    egress = pricing.load_egress(None, sites=pricing.load_inventory(settings.inventory).sites)
    return create_app(settings, clock=clock, providers=providers, catalog=catalog(), egress=egress,
                      gateway_options=gateway_options)


# ---------------------------------------------------------------------------------------------- builders
def job_doc(name: str = "job", *, providers: list[str] | None = None, cpu: str = "1", memory: str = "1Gi",
            arch: str | None = None, gpus: int = 0, hours: float = 0.01, deadline: datetime | None = None,
            data: list[dict[str, Any]] | None = None, command: list[str] | None = None,
            backoff_limit: int | None = None) -> dict[str, Any]:
    """A job spec document with only what a case sets."""
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if arch:
        resources["arch"] = arch
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": gpus}
    spec: dict[str, Any] = {"command": command or ["true"], "resources": resources, "durationHours": hours}
    if providers is not None:
        spec["placement"] = {"providers": providers}
    if deadline is not None:
        spec["deadline"] = deadline.isoformat().replace("+00:00", "Z")
    if data:
        spec["data"] = data
    if backoff_limit is not None:
        spec["retry"] = {"backoffLimit": backoff_limit, "retryDelaySeconds": 1}
    return {"apiVersion": "hybrid-broker/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


@dataclass(frozen=True)
class Dev:
    """A device as the registry holds it; ``seen_s_ago`` is how long ago it was last heard from."""

    id: str
    namespace: str = NS
    arch: str = "amd64"
    gpus: int = 0
    vcpus: float = 4
    memory_gib: float = 8
    bandwidth_mbps: float | None = 100.0
    hourly_usd: float = 0.0
    seen_s_ago: float = 5.0


def add_device(store: Any, dev: Dev, now: datetime) -> None:
    with store.tx() as s:
        s.add(devices.EdgeDeviceRow(
            id=dev.id, namespace=dev.namespace, cert_pem="-", cert_serial=f"serial-{dev.id}",
            cert_not_after=now + timedelta(days=1), enrolled_at=now - timedelta(days=1),
            last_seen=now - timedelta(seconds=dev.seen_s_ago), online=dev.seen_s_ago < 60, vcpus=dev.vcpus,
            memory_gib=dev.memory_gib, gpus=dev.gpus, accelerator="T4" if dev.gpus else None, arch=dev.arch,
            bandwidth_mbps=dev.bandwidth_mbps, hourly_usd=dev.hourly_usd,
        ))


def touch_device(store: Any, device_id: str, at: datetime) -> None:
    with store.tx() as s:
        row = s.get(devices.EdgeDeviceRow, device_id)
        assert row is not None
        row.last_seen = at
        s.add(row)


class Service:
    """A broker app with a manual clock, a FakeProvider ``aws``, and the edge wired in through a gateway
    that is built from a real CA but never connected (so dispatches are only recorded)."""

    def __init__(self, tmp_path: Path, store_url: str) -> None:
        self.clock = ManualClock()
        pki.CertificateAuthority.init(tmp_path / "data" / "ca")
        self.app = make_app(tmp_path, store_url, providers={"aws": FakeProvider("aws")}, clock=self.clock,
                            mqtt_url="mqtts://127.0.0.1:1", gateway_options={"offline_after_s": 60.0})
        self.hb = self.app.state.hb
        self.edge: EdgeService = self.hb.edge
        self.store = self.hb.store

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def submit(self, *docs: dict[str, Any]) -> list[str]:
        specs = [parse_job_spec(d, now=self.now) for d in docs]
        with self.store.tx() as s:
            jobs = submit_jobs(s, NS, specs, now=self.now, spec_docs=[json.dumps(x.raw) for x in specs])
        return [j["id"] for j in jobs]

    def job(self, job_id: str) -> JobRow:
        with self.store.read() as s:
            row = s.get(JobRow, job_id)
            assert row is not None
            return row

    def events(self, job_id: str) -> list[JobEventRow]:
        with self.store.read() as s:
            q = sa.select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)  # type: ignore[arg-type]
            return list(s.execute(q).scalars())

    def placed_on(self, job_id: str) -> str | None:
        """``provider:region`` of the job's latest PLACED event, or None."""
        placed = [e for e in self.events(job_id) if e.to_state == JobState.PLACED.value]
        if not placed:
            return None
        data = json.loads(placed[-1].data_json or "{}")
        return f"{data['provider']}:{data['region']}"

    def task(self, job_id: str) -> devices.EdgeTaskRow:
        row = self.job(job_id)
        ids = json.loads(row.instances_json or "[]")
        assert ids, f"job {job_id} has no instance ({row.state}, {row.message})"
        with self.store.read() as s:
            t = s.get(devices.EdgeTaskRow, ids[-1]["id"])
            assert t is not None
            return t

    def device_reports(self, task_id: str, state: str, exit_code: int | None = None,
                       results: tuple[Any, ...] = (), stdout: str = "") -> None:
        """What the gateway stores when a device reports a task outcome (the task row and the uplinks)."""
        now = self.now
        with self.store.tx() as s:
            t = s.get(devices.EdgeTaskRow, task_id)
            assert t is not None
            t.state, t.exit_code, t.updated_at = state, exit_code, now
            s.add(t)
            dev = s.get(devices.EdgeDeviceRow, t.device_id)
            assert dev is not None
            seq = dev.last_seq
            rows = [(f"{task_id}/r{i}", {"task_id": task_id, "n": i, "value": v}) for i, v in enumerate(results)]
            if state in ("succeeded", "failed"):
                rows.append((f"{task_id}/final", {"task_id": task_id, "state": state, "exit_code": exit_code,
                                                  "final": True, "results": len(results), "stdout_tail": stdout}))
            for msg_id, body in rows:
                seq += 1
                s.add(devices.UplinkRow(device_id=t.device_id, msg_id=msg_id, seq=seq, kind="result",
                                        ts_ms=0, body=json.dumps(body), received_at=now))
            dev.last_seq, dev.last_seen = seq, now
            s.add(dev)


@pytest.fixture()
def svc(tmp_path: Path, store_url: str) -> Iterator[Service]:
    s = Service(tmp_path, store_url)
    try:
        yield s
    finally:
        s.hb.store.dispose()


# ---------------------------------------------------------------------------------------------- placement
H = timedelta(hours=1)


@dataclass(frozen=True)
class PlaceCase:
    devices: tuple[Dev, ...]
    job: dict[str, Any]
    expect: str  # provider:region of the placement, or "FAILED"
    job_kw: dict[str, Any] = field(default_factory=dict)


def _case(devs: tuple[Dev, ...], expect: str, **job_kw: Any) -> PlaceCase:
    job_kw.setdefault("providers", ["edge", "aws"])
    return PlaceCase(devs, {}, expect, job_kw)


PLACE_CASES = [
    _case((Dev("dev-a"),), "edge:dev-a"),
    _case((Dev("dev-a"),), "edge:dev-a", providers=None),
    _case((Dev("dev-a"),), "aws", providers=["aws"]),
    _case((Dev("dev-arm", arch="arm64"),), "aws"),
    _case((Dev("dev-arm", arch="arm64"),), "edge:dev-arm", arch="arm64"),
    _case((Dev("dev-a"),), "aws", gpus=1),
    _case((Dev("dev-gpu", gpus=1),), "edge:dev-gpu", gpus=1),
    _case((Dev("dev-small", vcpus=2, memory_gib=2),), "aws", cpu="4"),
    _case((Dev("dev-b", namespace="team-b"),), "aws"),
    _case((Dev("dev-slow", bandwidth_mbps=1.0), Dev("dev-fast", bandwidth_mbps=1000.0, hourly_usd=0.5)),
          "edge:dev-slow", providers=["edge"], data=[{"uri": "s3://b/x", "location": "aws:us-east-1", "sizeGiB": 1}]),
    _case((Dev("dev-slow", bandwidth_mbps=1.0), Dev("dev-fast", bandwidth_mbps=1000.0, hourly_usd=0.5)),
          "edge:dev-fast", providers=["edge"], deadline_h=1.0,
          data=[{"uri": "s3://b/x", "location": "aws:us-east-1", "sizeGiB": 1}]),
    _case((Dev("dev-slow", bandwidth_mbps=1.0),), "FAILED", providers=["edge"], deadline_h=1.0,
          data=[{"uri": "s3://b/x", "location": "aws:us-east-1", "sizeGiB": 1}]),
    _case((Dev("dev-away", seen_s_ago=1800),), "aws", deadline_h=0.3),
    _case((Dev("dev-away", seen_s_ago=600),), "edge:dev-away", deadline_h=3.0),
    _case((Dev("dev-away", seen_s_ago=600),), "edge:dev-away"),
    _case((Dev("dev-gone", seen_s_ago=3 * 3600),), "aws"),
]
PLACE_IDS = [
    "an online device is cheaper than any cloud",
    "empty placement.providers lets a job land on a device",
    "placement.providers without edge keeps the job off devices",
    "an arm64 device does not take an amd64 job",
    "an arm64 device takes an arm64 job",
    "a GPU job skips a device without a GPU",
    "a device with a GPU takes a GPU job",
    "a device too small for the request is not chosen",
    "a device of another namespace is not offered",
    "without a deadline the cheaper slow-link device wins",
    "input data over a slow link misses the deadline so the faster dearer device wins",
    "no device can receive the input before the deadline so an edge-only job fails",
    "a device offline longer than the job can wait is not chosen",
    "a device offline shorter than the job can wait is chosen",
    "a job without a deadline waits ten minutes for a device by default",
    "a device silent for hours is not capacity",
]


@pytest.mark.parametrize("case", PLACE_CASES, ids=PLACE_IDS)
def test_edge_devices_are_placed_like_any_capacity(svc: Service, case: PlaceCase) -> None:
    for d in case.devices:
        add_device(svc.store, d, svc.now)
    kw = dict(case.job_kw)
    deadline_h = kw.pop("deadline_h", None)
    if deadline_h is not None:
        kw["deadline"] = svc.now + timedelta(hours=deadline_h)
    (job_id,) = svc.submit(job_doc(**kw))
    svc.hb.scheduler.run_cycle()
    row = svc.job(job_id)
    if case.expect == "FAILED":
        assert row.state == JobState.FAILED.value and svc.placed_on(job_id) is None, row.message
        return
    placed = svc.placed_on(job_id)
    assert placed is not None, (row.state, row.message)
    if case.expect == "aws":
        assert placed.startswith("aws:"), placed
    else:
        assert placed == case.expect
        assert row.state == JobState.RUNNING.value and row.provider == "edge"
        task = svc.task(job_id)
        assert task.device_id == case.expect.split(":")[1] and task.state == "dispatched"
        assert task.job_id == row.request_id and job_of_request(task.job_id) == job_id


def test_device_sites_feed_the_egress_model_of_previews(svc: Service) -> None:
    add_device(svc.store, Dev("dev-link", bandwidth_mbps=8.0), svc.now)
    svc.hb.extra_offers()  # the fleet refresh the scheduler's snapshot does
    egress = svc.hb.egress_model()
    assert "edge:dev-link" in egress.sites
    assert egress.gbps("aws:us-east-1", "edge:dev-link") == pytest.approx(0.008)
    assert svc.hb.egress_model() is egress  # unchanged sites: the same model, its route cache kept


# ---------------------------------------------------------------------------------------------- outcomes
def _running_on_edge(svc: Service, *devs: Dev, **job_kw: Any) -> tuple[str, devices.EdgeTaskRow]:
    for d in devs:
        add_device(svc.store, d, svc.now)
    job_kw.setdefault("providers", ["edge"])
    (job_id,) = svc.submit(job_doc(**job_kw))
    svc.hb.scheduler.run_cycle()
    assert svc.job(job_id).state == JobState.RUNNING.value
    return job_id, svc.task(job_id)


@pytest.mark.parametrize("via_sink", [True, False], ids=["the gateway's sink applies it", "the sweep applies it"])
def test_a_succeeded_task_completes_its_job_with_exit_code_and_results(svc: Service, via_sink: bool) -> None:
    job_id, task = _running_on_edge(svc, Dev("dev-a"))
    svc.clock.advance(30)
    svc.device_reports(task.task_id, "succeeded", 0, results=({"i": 0}, {"i": 1}), stdout="done")
    if via_sink:
        svc.edge.runner.task_status(task.job_id, "SUCCEEDED", 0, {"task_id": task.task_id, "device": "dev-a"})
    else:
        svc.hb.scheduler.run_cycle()
    row = svc.job(job_id)
    assert row.state == JobState.SUCCEEDED.value and row.exit_code == 0
    last = svc.events(job_id)[-1]
    assert (last.from_state, last.to_state) == ("RUNNING", "SUCCEEDED")
    data = json.loads(last.data_json or "{}")
    assert data["device"] == "dev-a" and data["results"] == [{"i": 0}, {"i": 1}] and data["stdout_tail"] == "done"
    # applying it again (the other path, or a redelivery) changes nothing
    svc.edge.runner.task_status(task.job_id, "SUCCEEDED", 0, {"task_id": task.task_id})
    svc.hb.scheduler.run_cycle()
    assert [e.to_state for e in svc.events(job_id)].count("SUCCEEDED") == 1
    # the run was charged to its namespace's fair-share usage, once (30 s of the job's vCPUs)
    from broker.queues import FairShareUsageRow

    with svc.hb.store.read() as s:
        usage = s.get(FairShareUsageRow, row.namespace)
    assert usage is not None and usage.cpu_hours == pytest.approx(row.vcpus * 30 / 3600, rel=0.05)


@pytest.mark.parametrize(
    ("backoff_limit", "expect"), [(0, JobState.FAILED), (2, JobState.BACKOFF)],
    ids=["a failed task fails a job without retries", "a failed task backs off a job with retries left"],
)
def test_a_failed_task_follows_the_jobs_retry_policy(svc: Service, backoff_limit: int, expect: JobState) -> None:
    job_id, task = _running_on_edge(svc, Dev("dev-a"), backoff_limit=backoff_limit)
    svc.device_reports(task.task_id, "failed", 3)
    svc.edge.runner.task_status(task.job_id, "FAILED", 3, {"task_id": task.task_id})
    row = svc.job(job_id)
    assert row.state == expect.value and row.exit_code == 3
    assert "exit code 3" in (row.message or "")


def test_busy_devices_take_no_more_than_their_cpus_and_the_rest_wait(svc: Service) -> None:
    for d in (Dev("dev-2a", vcpus=2), Dev("dev-2b", vcpus=2)):
        add_device(svc.store, d, svc.now)
    ids = svc.submit(*[job_doc(f"two-cpu-{i}", providers=["edge"], cpu="2", memory="1Gi") for i in range(6)])
    svc.hb.scheduler.run_cycle()
    states = [svc.job(j).state for j in ids]
    assert states.count(JobState.RUNNING.value) == 2, [(svc.job(j).state, svc.job(j).message) for j in ids]
    assert JobState.FAILED.value not in states  # the others wait for a device, they do not fail
    assert sorted(svc.task(j).device_id for j in ids if svc.job(j).state == JobState.RUNNING.value) == [
        "dev-2a", "dev-2b"]
    done = next(j for j in ids if svc.job(j).state == JobState.RUNNING.value)
    svc.clock.advance(5)
    touch_device(svc.store, "dev-2a", svc.now)
    touch_device(svc.store, "dev-2b", svc.now)
    svc.device_reports(svc.task(done).task_id, "succeeded", 0)
    svc.hb.scheduler.run_cycle()
    svc.hb.scheduler.run_cycle()
    states = [svc.job(j).state for j in ids]
    assert states.count(JobState.RUNNING.value) == 2 and states.count(JobState.SUCCEEDED.value) == 1


def test_a_lost_device_is_cordoned_until_it_is_heard_from_again(svc: Service) -> None:
    """With ``BROKER_DEVICE_LOST_AFTER_SECONDS`` a device silent for longer is lost (the health monitor
    re-places its jobs): no job is placed on it, jobs wait for it (PENDING, not FAILED), until it is heard
    from again."""
    svc.edge.fleet.lost_after_s = 30.0
    add_device(svc.store, Dev("dev-quiet"), svc.now)
    svc.clock.advance(45)  # within the gateway's offline_after_s (60 s): only the lost rule keeps it out
    (job_id,) = svc.submit(job_doc("after-loss", providers=["edge"]))
    svc.hb.scheduler.run_cycle()
    row = svc.job(job_id)
    assert row.state == JobState.PENDING.value, (row.state, row.message)
    touch_device(svc.store, "dev-quiet", svc.now)
    svc.hb.scheduler.run_cycle()
    assert svc.job(job_id).state == JobState.RUNNING.value and svc.task(job_id).device_id == "dev-quiet"


def test_active_deadline_seconds_is_the_tasks_time_limit_and_bad_values_are_refused(svc: Service) -> None:
    doc = job_doc("deadline-job", providers=["edge"])
    doc["spec"]["activeDeadlineSeconds"] = 45
    add_device(svc.store, Dev("dev-ad"), svc.now)
    (job_id,) = svc.submit(doc)
    svc.hb.scheduler.run_cycle()
    assert json.loads(svc.task(job_id).body)["timeout_seconds"] == 45
    doc["spec"]["activeDeadlineSeconds"] = -1
    with pytest.raises(SpecError, match="activeDeadlineSeconds"):
        parse_job_spec(doc, now=svc.now)


def test_edge_rejections_are_on_the_apps_metrics(svc: Service) -> None:
    gw = svc.edge.gateway
    gw.process([(protocol.up_topic("ghost-dev", "telemetry"), b"{not json")])
    text = svc.hb.metrics.render().decode()
    assert 'hb_edge_rejected_total{reason="malformed"} 1.0' in text


def test_a_running_report_is_a_note_not_a_state_change(svc: Service) -> None:
    job_id, task = _running_on_edge(svc, Dev("dev-a"))
    svc.edge.runner.task_status(task.job_id, "RUNNING", None, {"task_id": task.task_id})
    last = svc.events(job_id)[-1]
    assert (last.from_state, last.to_state) == ("RUNNING", "RUNNING") and "started task" in last.reason
    assert svc.job(job_id).state == JobState.RUNNING.value


def test_a_running_report_that_came_before_the_job_was_running_is_noted_once_by_the_sweep(svc: Service) -> None:
    """A fast device reports its task running before the scheduler has committed the job RUNNING: the sink
    ignores it then (the job is not RUNNING that task yet), and the next sweep notes the start, once."""
    job_id, task = _running_on_edge(svc, Dev("dev-a"))
    svc.device_reports(task.task_id, "running")  # stored by the gateway; its sink call came too early
    assert not any("started task" in e.reason for e in svc.events(job_id))
    svc.hb.scheduler.run_cycle()
    svc.hb.scheduler.run_cycle()

    def notes() -> list[Any]:
        return [e for e in svc.events(job_id) if f"started task {task.task_id}" in e.reason]

    assert len(notes()) == 1 and (notes()[0].from_state, notes()[0].to_state) == ("RUNNING", "RUNNING")
    svc.edge.runner.task_status(task.job_id, "RUNNING", None, {"task_id": task.task_id})  # a redelivery
    assert len(notes()) == 1
    assert svc.job(job_id).state == JobState.RUNNING.value


def test_a_lost_task_is_replaced_elsewhere_and_its_late_result_is_ignored(svc: Service) -> None:
    job_id, first = _running_on_edge(svc, Dev("dev-a"))
    add_device(svc.store, Dev("dev-b"), svc.now)
    retries = svc.job(job_id).retries
    svc.clock.advance(5)
    svc.device_reports(first.task_id, "lost")
    svc.edge.runner.task_status(first.job_id, "LOST", None, {"task_id": first.task_id, "reason": "device offline"})
    row = svc.job(job_id)
    assert row.state == JobState.PENDING.value and row.retries == retries and "lost the task" in (row.message or "")
    svc.hb.scheduler.run_cycle()
    second = svc.task(job_id)
    assert second.device_id == "dev-b" and second.task_id != first.task_id
    # dev-a comes back and reports the old task done: recorded by the gateway, never applied to the job
    svc.edge.runner.task_status(first.job_id, "SUCCEEDED", 0, {"task_id": first.task_id})
    assert svc.job(job_id).state == JobState.RUNNING.value
    svc.device_reports(second.task_id, "succeeded", 0)
    svc.hb.scheduler.run_cycle()
    assert svc.job(job_id).state == JobState.SUCCEEDED.value
    assert [e.to_state for e in svc.events(job_id)].count("SUCCEEDED") == 1


def test_a_job_waits_for_its_only_device_after_losing_it_and_goes_back_when_it_returns(svc: Service) -> None:
    job_id, first = _running_on_edge(svc, Dev("dev-a"))
    svc.clock.advance(5)
    svc.device_reports(first.task_id, "lost")
    svc.edge.runner.task_status(first.job_id, "LOST", None, {"task_id": first.task_id})
    svc.hb.scheduler.run_cycle()
    row = svc.job(job_id)
    assert row.state == JobState.PENDING.value and "waiting for edge device dev-a" in (row.held_reason or "")
    svc.clock.advance(5)
    touch_device(svc.store, "dev-a", svc.now)  # heard from again
    svc.hb.scheduler.run_cycle()
    again = svc.task(job_id)
    assert svc.job(job_id).state == JobState.RUNNING.value
    assert again.device_id == "dev-a" and again.task_id != first.task_id


def test_cancelling_a_job_cancels_its_open_task_and_ignores_the_device_report(svc: Service) -> None:
    job_id, task = _running_on_edge(svc, Dev("dev-a"))
    from broker.api import cancel_job

    answer = cancel_job(job_id, NS, svc.hb)  # the DELETE handler: the cancel downlink for the task, then CANCELLED
    assert answer.status_code == 200 and json.loads(answer.body)["state"] == JobState.CANCELLED.value
    svc.device_reports(task.task_id, "cancelled")
    svc.edge.runner.task_status(task.job_id, "CANCELLED", None, {"task_id": task.task_id})
    assert svc.job(job_id).state == JobState.CANCELLED.value


@pytest.mark.parametrize(
    ("url", "expect"),
    [("mqtts://mq.example:8884", ("mq.example", 8884)), ("mqtts://127.0.0.1", ("127.0.0.1", 8883)),
     ("mqtt://127.0.0.1:1883", None), ("127.0.0.1:8883", None), ("mqtts://h:99999", None)],
    ids=["host and port", "port 8883 by default", "plain mqtt is refused", "no scheme is refused",
         "a port out of range is refused"],
)
def test_the_mqtt_url_must_be_mqtts(url: str, expect: tuple[str, int] | None) -> None:
    if expect is None:
        with pytest.raises(SpecError, match="To fix"):
            parse_mqtt_url(url)
    else:
        assert parse_mqtt_url(url) == expect


def test_a_missing_gateway_certificate_stops_the_app_with_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="broker ca init"):
        make_app(tmp_path, f"sqlite:///{tmp_path / 'b.db'}", providers={}, mqtt_url="mqtts://127.0.0.1:1")


# ---------------------------------------------------------------------------------------------- end to end
class CliMosquitto(Mosquitto):
    """Mosquitto run from exactly what ``broker ca init`` and ``broker mqtt config`` wrote."""

    def __init__(self, directory: Path, conf: Path, port: int, ca_dir: Path) -> None:
        self.dir, self.conf, self.port, self.ca_dir = directory, conf, port, ca_dir
        self.proc = None
        self.log = directory / "mosquitto.log"


def _cli(*args: str) -> None:
    from broker.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    assert exc.value.code in (0, None), args


@dataclass
class Stack:
    url: str
    app: Any
    mosquitto: CliMosquitto
    agents: list[AgentProcess] = field(default_factory=list)

    def enroll(self, state_dir: Path, device_id: str, **cfg: Any) -> AgentProcess:
        """Enroll over HTTP (the broker announces its MQTT URL) and start ``edge-agent run`` (``cfg``: agent
        settings to change)."""
        import dataclasses

        from edge.agent.enroll import enroll

        token = httpx.post(f"{self.url}/v1/edge/enroll-tokens", json={"namespace": NS}, headers=ADMIN_H).json()
        config = enroll(self.url, token["token"], state_dir, device_id=device_id)
        assert (config.mqtt_host, config.mqtt_port) == ("127.0.0.1", self.mosquitto.port)
        settings = {"heartbeat_seconds": 1.0, "retransmit_seconds": 2.0, "reconnect_max_seconds": 1,
                    "task_user": "", **cfg}
        dataclasses.replace(config, **settings).save()
        agent = AgentProcess(state_dir)
        agent.start()
        self.agents.append(agent)
        wait_until(lambda: self.device(device_id)["vcpus"] > 0, 20, f"{device_id} to report its capacity")
        return agent

    def device(self, device_id: str) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/v1/devices", headers=ADMIN_H)
        found = [d for d in r.json()["devices"] if d["id"] == device_id]
        return found[0] if found else {"vcpus": 0, "status": "absent"}

    def submit(self, doc: dict[str, Any]) -> str:
        r = httpx.post(f"{self.url}/v1/namespaces/{NS}/jobs", json=doc, headers=ADMIN_H)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def get(self, job_id: str) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/v1/namespaces/{NS}/jobs/{job_id}", headers=ADMIN_H)
        assert r.status_code == 200, r.text
        return dict(r.json())


@contextlib.contextmanager
def open_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, gateway_options: dict[str, Any] | None = None,
               **overrides: Any) -> Iterator[Stack]:
    """The whole edge stack (``broker ca init``/``mqtt config`` -> Mosquitto, the broker app under uvicorn);
    ``gateway_options`` and settings ``overrides`` replace the defaults below."""
    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install -y mosquitto)")
    data = tmp_path / "data"
    monkeypatch.setenv("BROKER_DATA_DIR", str(data))
    port = free_port()
    _cli("ca", "init", "--local")  # before the broker first starts (it needs the gateway certificate)
    user = ["--user", "root"] if os.geteuid() == 0 else []
    _cli("mqtt", "config", "--out", str(tmp_path / "mqtt"), "--port", str(port), "--bind", "127.0.0.1", *user)
    mq = CliMosquitto(tmp_path / "mqtt", tmp_path / "mqtt" / "mosquitto.conf", port, data / "ca")
    mq.start()
    wait_port(port)
    # Only the URL is configured: the gateway finds its certificate files in <data dir>/ca by default.
    settings = {"data_dir": data, "mqtt_url": f"mqtts://127.0.0.1:{port}", "scheduler_enabled": True,
                "scheduler_interval_seconds": 0.2, **overrides}
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'broker.db'}", providers={"aws": FakeProvider("aws")},
                   gateway_options={"offline_after_s": 2.0, "replace_after_s": 2.0, "client_id": "hb-gw-test",
                                    **(gateway_options or {})}, **settings)
    st: Stack | None = None
    try:
        with serve_in_thread(app) as url:
            st = Stack(url, app, mq)
            wait_until(lambda: app.state.hb.edge.gateway.connected, 10, "the gateway to connect")
            yield st
    finally:
        for a in st.agents if st else []:
            a.stop()
        mq.stop()


@pytest.fixture()
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    with open_stack(tmp_path, monkeypatch) as st:
        yield st


def _done(stack: Stack, job_id: str) -> bool:
    return stack.get(job_id)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")


@pytest.mark.slow
def test_a_job_submitted_over_http_runs_on_a_device_and_its_output_is_visible(tmp_path: Path, stack: Stack) -> None:
    stack.enroll(tmp_path / "dev-1", "edge-svc-1")
    code = "import json\nfor i in range(3): print('@hb-result ' + json.dumps({'sq': i * i}))\nprint('bye')\n"
    job_id = stack.submit(job_doc("on-edge", providers=["edge"], command=[sys.executable, "-c", code]))
    wait_until(lambda: _done(stack, job_id), 30, "the job to finish", step=0.2)
    job = stack.get(job_id)
    assert job["state"] == "SUCCEEDED" and job["exit_code"] == 0, job["events"]
    assert job["placement"]["provider"] == "edge" and job["placement"]["region"] == "edge-svc-1"
    states = [(e["from"], e["to"]) for e in job["events"] if e["from"] != e["to"]]
    assert states == [(None, "PENDING"), ("PENDING", "PLACED"), ("PLACED", "PROVISIONING"),
                      ("PROVISIONING", "RUNNING"), ("RUNNING", "SUCCEEDED")]
    final = job["events"][-1]["data"]
    assert final["results"] == [{"sq": 0}, {"sq": 1}, {"sq": 4}] and final["stdout_tail"] == "bye"
    assert final["device"] == "edge-svc-1"


@pytest.mark.slow
def test_a_device_going_offline_mid_task_gets_its_job_replaced_and_it_completes_once(
        tmp_path: Path, stack: Stack) -> None:
    go = tmp_path / "go"
    code = (f"import os, time\nend = time.time() + 20\nwhile not os.path.exists({str(go)!r}) and time.time() < end:"
            f"\n    time.sleep(0.05)\nprint('@hb-result ' + os.environ.get('HOSTNAME', 'x'))\n")
    first = stack.enroll(tmp_path / "dev-a", "edge-svc-a")
    job_id = stack.submit(job_doc("survivor", providers=["edge"], command=[sys.executable, "-c", code]))
    wait_until(lambda: any("started task" in e["reason"] for e in stack.get(job_id)["events"]), 20,
               "edge-svc-a to start the task", step=0.1)
    stack.enroll(tmp_path / "dev-b", "edge-svc-b")
    first.kill9()  # the device drops off mid-task; its task process is left waiting for the go file
    wait_until(lambda: any("lost the task" in e["reason"] for e in stack.get(job_id)["events"]), 20,
               "the gateway to give up on edge-svc-a", step=0.2)
    go.touch()
    wait_until(lambda: _done(stack, job_id), 20, "the job to finish elsewhere", step=0.2)
    job = stack.get(job_id)
    assert job["state"] == "SUCCEEDED", job["events"]
    assert job["placement"]["region"] == "edge-svc-b"
    assert [e["to"] for e in job["events"] if e["from"] != e["to"]].count("SUCCEEDED") == 1
    # edge-svc-a comes back: it restarts or is told to cancel its old task; nothing reaches the job again
    first.start()
    hb = stack.app.state.hb

    def tasks() -> dict[str, devices.EdgeTaskRow]:
        with hb.store.read() as s:
            return {t.device_id: t for t in s.execute(sa.select(devices.EdgeTaskRow)).scalars()}

    wait_until(lambda: tasks()["edge-svc-a"].late_outcome is not None, 20, "edge-svc-a to report its old task")
    assert tasks()["edge-svc-a"].state == "lost" and tasks()["edge-svc-b"].state == "succeeded"
    after = stack.get(job_id)
    assert after["state"] == "SUCCEEDED" and len(after["events"]) == len(job["events"])


def test_a_namespace_token_sees_only_its_own_devices_in_offers_and_previews(svc: Service) -> None:
    """Issue 17: ``/v1/catalog/offers`` and ``/v1/placements:preview`` (any token) never show a device of another
    namespace: not in the offers, not as the preview's choice or runner-up."""
    add_device(svc.store, Dev("dev-mine", namespace=NS, hourly_usd=0.02), svc.now)
    add_device(svc.store, Dev("dev-theirs", namespace="team-b", hourly_usd=0.01), svc.now)
    svc.hb.edge.fleet.refresh(svc.now)
    with serve_in_thread(svc.app) as url, httpx.Client(base_url=url, timeout=30) as c:
        assert c.post("/v1/namespaces", json={"name": "team-b"}, headers=ADMIN_H).status_code == 201
        token = c.post(f"/v1/namespaces/{NS}/tokens", headers=ADMIN_H).json()["token"]
        mine = {"Authorization": f"Bearer {token}"}
        offers = c.get("/v1/catalog/offers", params={"provider": "edge"}, headers=mine).json()
        admin_offers = c.get("/v1/catalog/offers", params={"provider": "edge"}, headers=ADMIN_H).json()
        preview = c.post("/v1/placements:preview", json=job_doc("p", providers=["edge"]), headers=mine)
    assert [o["region"] for o in offers["offers"]] == ["dev-mine"] and offers["total"] == 1
    assert {o["region"] for o in admin_offers["offers"]} == {"dev-mine", "dev-theirs"}
    assert preview.status_code == 200, preview.text
    assert "dev-theirs" not in preview.text and "team-b" not in preview.text
    assert preview.json()["placement"]["region"] == "dev-mine"
