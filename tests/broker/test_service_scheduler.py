"""The scheduler cycle and job lifecycle, on SQLite and PostgreSQL, with a manual clock and real providers
(the on-prem pool runs commands for real; ``aws`` is the in-memory FakeProvider or the dry-run provider)."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from broker.clock import ManualClock
from broker.errors import CapacityError, TransientError
from broker.lifecycle import submit_jobs
from broker.model import InstanceState, JobState, RetryPolicy
from broker.spec import parse_job_spec
from broker.store import JobRow
from providers.dryrun import DryRunProvider
from providers.failover import backoff_delay
from providers.fake import FakeProvider
from providers.onprem import OnPremPool
from tests.broker.service_support import ADMIN_H, job_doc, make_app, serve_in_thread

NS = "default"


class Harness:
    """An app with a manual clock, its providers, and helpers to submit and inspect jobs."""

    def __init__(self, tmp_path: Path, store_url: str, aws: Any = None, **overrides: Any) -> None:
        import pricing

        self.clock = ManualClock()
        inventory = pricing.load_inventory(tmp_path / "inventory.yaml") if (tmp_path / "inventory.yaml").exists() \
            else None
        from tests.broker.service_support import write_inventory

        inventory = pricing.load_inventory(write_inventory(tmp_path))
        self.pool = OnPremPool(inventory, tmp_path / "data", clock=self.clock, grace_seconds=1.0)
        self.aws = aws if aws is not None else FakeProvider("aws")
        self.app = make_app(tmp_path, store_url, providers={"onprem": self.pool, "aws": self.aws}, clock=self.clock,
                            **overrides)
        self.hb = self.app.state.hb
        self.scheduler = self.hb.scheduler

    def submit(self, *docs: dict[str, Any]) -> list[str]:
        specs = [parse_job_spec(d, now=self.clock.now()) for d in docs]
        with self.hb.store.tx() as session:
            jobs = submit_jobs(session, NS, specs, now=self.clock.now(),
                               spec_docs=[json.dumps(s.raw) for s in specs])
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

    def path(self, job_id: str) -> list[str]:
        return [e["to"] for e in self.detail(job_id)["events"] if e["from"] != e["to"]]

    def until(self, job_ids: list[str], states: set[str], seconds: float = 20.0) -> None:
        """Run cycles (real time passes for on-prem runs) until every job is in one of ``states``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.scheduler.run_cycle()
            if all(self.job(j).state in states for j in job_ids):
                return
            time.sleep(0.05)
        raise AssertionError({j: self.job(j).state for j in job_ids})

    def stop_runs(self) -> None:
        live = [i.id for i in self.pool.instances() if i.state is InstanceState.RUNNING]
        if live:
            self.pool.terminate(live, "test-cleanup")
        self.hb.store.dispose()


@pytest.fixture
def h(tmp_path: Path, store_url: str) -> Iterator[Harness]:
    harness = Harness(tmp_path, store_url)
    yield harness
    harness.stop_runs()


def test_on_prem_first_while_it_has_room_then_burst_to_the_cheapest_cloud(h: Harness) -> None:
    ids = h.submit(*[job_doc(f"s-{i}", command=["sleep", "30"], hours=1) for i in range(3)])
    report = h.scheduler.run_cycle()
    assert (report.heads, report.placed, report.provisioned) == (3, 3, 3)
    providers = [h.job(i).provider for i in ids]
    assert providers == ["onprem", "onprem", "aws"], "the 2-vCPU host takes two 1-vCPU jobs, the third bursts"
    for i in ids:
        assert h.job(i).state == "RUNNING"
        assert h.path(i) == ["PENDING", "PLACED", "PROVISIONING", "RUNNING"]
    burst = h.detail(ids[2])
    assert burst["placement"]["provider"] == "aws" and burst["placement"]["total_usd"] > 0
    assert "burst" in next(e["reason"] for e in burst["events"] if e["to"] == "PLACED")
    assert [a["outcome"] for a in burst["attempts"]] == ["launched"]


def test_an_on_prem_job_runs_for_real_and_its_logs_are_kept(h: Harness) -> None:
    (job_id,) = h.submit(job_doc("echo", command=["sh", "-c", "echo hello-from-job"], providers=["onprem"]))
    h.until([job_id], {"SUCCEEDED", "FAILED"})
    row = h.job(job_id)
    assert (row.state, row.exit_code, row.provider) == ("SUCCEEDED", 0, "onprem")
    out, _ = h.pool.logs(json.loads(row.instances_json or "[]")[0]["id"])
    assert out.read_text() == "hello-from-job\n"


def test_a_failing_run_is_retried_with_backoff_then_fails(h: Harness) -> None:
    (job_id,) = h.submit(job_doc("boom", command=["sh", "-c", "exit 3"], providers=["onprem"],
                                 retry={"backoffLimit": 1, "retryDelaySeconds": 30, "maxRetryDelaySeconds": 60}))
    h.until([job_id], {"BACKOFF"})
    row = h.job(job_id)
    assert row.retries == 1 and row.exit_code == 3 and row.not_before is not None
    h.scheduler.run_cycle()
    assert h.job(job_id).state == "BACKOFF", "the delay has not passed on the clock yet"
    h.clock.advance(31)
    h.until([job_id], {"FAILED"})
    assert h.path(job_id) == ["PENDING", "PLACED", "PROVISIONING", "RUNNING", "BACKOFF", "PENDING", "PLACED",
                              "PROVISIONING", "RUNNING", "FAILED"]


def test_a_capacity_error_fails_over_to_the_next_alternative(tmp_path: Path, store_url: str) -> None:
    h = Harness(tmp_path, store_url, aws=FakeProvider("aws", fail=[CapacityError("no m5 left")]))
    try:
        (job_id,) = h.submit(job_doc("fo", cpu="4", memory="8Gi", providers=["aws"]))
        h.scheduler.run_cycle()
        d = h.detail(job_id)
        assert d["state"] == "RUNNING"
        assert [a["outcome"] for a in d["attempts"]] == ["capacity", "launched"]
        first, second = d["attempts"]
        assert (first["instance_type"], first["region"]) != (second["instance_type"], second["region"])
        assert d["placement"]["instance_type"] == second["instance_type"], "placement shows what really runs"
    finally:
        h.stop_runs()


def test_a_stop_ends_a_launch_retry_wait_at_once_and_leaves_the_job_to_reconciliation(
        tmp_path: Path, store_url: str) -> None:
    from broker.clock import SystemClock
    from tests.broker.service_support import make_app

    aws = FakeProvider("aws", fail=lambda *a: TransientError("throttled"))
    # a wait budget over the spec's delays: the launch really sleeps in the cycle (the default, 10 s, would
    # block the offer and move on instead: tests/providers/test_providers_failover.py)
    app = make_app(tmp_path, store_url, providers={"aws": aws}, clock=SystemClock(), launch_retry_wait_seconds=3600)
    hb = app.state.hb
    try:
        slow = {"backoffLimit": 5, "retryDelaySeconds": 600, "maxRetryDelaySeconds": 600}
        spec = parse_job_spec(job_doc("slow", providers=["aws"], retry=slow), now=hb.clock.now())
        with hb.store.tx() as session:
            [job] = submit_jobs(session, NS, [spec], now=hb.clock.now(), spec_docs=[json.dumps(spec.raw)])
        stop = threading.Event()
        loop = threading.Thread(target=hb.scheduler.run_forever, args=(stop,), daemon=True)
        loop.start()
        deadline = time.monotonic() + 20
        while not aws.launch_calls:  # the first try failed: the launch now waits 300-600 s to be retried
            assert time.monotonic() < deadline, "the scheduler never tried the launch"
            time.sleep(0.05)
        stop.set()
        loop.join(10)
        assert not loop.is_alive(), "the stop ended the retry wait"
        assert len(aws.launch_calls) == 1
        with hb.store.read() as session:
            row = session.get(JobRow, job["id"])
            # neither failed nor charged a retry by the shutdown: left to the next start's reconciliation
            assert row is not None and (row.state, row.retries) == ("PROVISIONING", 0)
    finally:
        hb.store.dispose()


def test_transient_errors_are_retried_per_option_with_the_spec_backoff_then_the_job_fails_saying_why(
        tmp_path: Path, store_url: str) -> None:
    # the launch's wait budget over the spec's delays (10 + 15 s per option): every retry is slept in the cycle
    h = Harness(tmp_path, store_url, aws=FakeProvider("aws", fail=lambda *a: TransientError("throttled")),
                launch_retry_wait_seconds=3600)
    try:
        spec_retry = {"backoffLimit": 2, "retryDelaySeconds": 10, "maxRetryDelaySeconds": 15}
        (job_id,) = h.submit(job_doc("tr", providers=["aws"], retry=spec_retry))
        h.scheduler.rng.seed(3)
        h.scheduler.run_cycle()
        row = h.job(job_id)
        assert row.state == "FAILED", "every option was out of its retries: no second round through BACKOFF"
        attempts = h.detail(job_id)["attempts"]
        options = list(dict.fromkeys((a["region"], a["instance_type"], a["capacity"]) for a in attempts))
        assert len(options) >= 2 and [a["outcome"] for a in attempts] == ["transient"] * (3 * len(options))
        # per option: the first try and backoffLimit=2 retries, delays 10 then min(15, 20) with jitter
        rng = random.Random(3)
        retry = RetryPolicy(2, 10, 15)
        expected = [backoff_delay(retry, n, rng) for _ in options for n in range(2)]
        assert h.clock.sleeps == expected
        assert all(5 <= d <= 10 for d in expected[0::2]) and all(7.5 <= d <= 15 for d in expected[1::2])
        assert [a["delay_seconds"] for a in attempts] == [d for pair in zip(expected[0::2], expected[1::2],
                                                                           strict=True) for d in (*pair, 0.0)]
        assert row.message is not None
        assert row.message.startswith(f"every placement option failed ({len(options)} tried): aws:")
        assert row.message.count("3 transient errors") == len(options) and "gave up after 2 retries" in row.message
        assert h.aws.running() == []
    finally:
        h.stop_runs()


def test_an_admission_check_holds_a_job_with_its_reason(h: Harness) -> None:
    (job_id,) = h.submit(job_doc("held", providers=["aws"]))
    h.scheduler.admission_checks.append(lambda job, snap: "quota exceeded: cpu 8/8")
    h.scheduler.run_cycle()
    h.scheduler.run_cycle()
    d = h.detail(job_id)
    assert d["state"] == "PENDING" and d["held_reason"] == "quota exceeded: cpu 8/8"
    assert [e["reason"] for e in d["events"]].count("held: quota exceeded: cpu 8/8") == 1, "one note per reason"
    h.scheduler.admission_checks.clear()
    h.scheduler.run_cycle()
    assert h.job(job_id).state == "RUNNING" and h.job(job_id).held_reason is None


def test_an_on_prem_only_job_waits_while_on_prem_is_full(h: Harness) -> None:
    ids = h.submit(*[job_doc(f"w-{i}", command=["sleep", "30"], providers=["onprem"]) for i in range(3)])
    h.scheduler.run_cycle()
    assert [h.job(i).state for i in ids] == ["RUNNING", "RUNNING", "PENDING"]
    assert h.job(ids[2]).held_reason == "waiting for on-prem capacity"


def test_a_job_nothing_can_run_fails_with_the_reasons(h: Harness) -> None:
    (job_id,) = h.submit(job_doc("huge", cpu="4000", memory="16Gi", providers=["aws"]))
    h.scheduler.run_cycle()
    row = h.job(job_id)
    assert row.state == "FAILED" and "no feasible placement" in (row.message or "")


def test_priority_orders_the_queue(h: Harness) -> None:
    low = h.submit(job_doc("low", command=["sleep", "30"], providers=["onprem"], cpu="2"))
    high = h.submit(job_doc("high", command=["sleep", "30"], providers=["onprem"], cpu="2", priority=100))
    h.scheduler.run_cycle()
    assert (h.job(high[0]).state, h.job(low[0]).state) == ("RUNNING", "PENDING")


def test_dry_run_clouds_finish_after_the_estimate_on_the_clock(tmp_path: Path, store_url: str) -> None:
    clock_holder: dict[str, Any] = {}
    h = Harness(tmp_path, store_url, aws=None)
    h.aws = DryRunProvider("aws", clock=h.clock)
    h.hb.providers["aws"] = h.aws
    clock_holder["c"] = h.clock
    try:
        (job_id,) = h.submit(job_doc("dry", providers=["aws"], hours=2))
        h.scheduler.run_cycle()
        row = h.job(job_id)
        assert (row.state, row.dry_run) == ("RUNNING", True)
        h.clock.advance(3600)
        h.scheduler.run_cycle()
        assert h.job(job_id).state == "RUNNING"
        h.clock.advance(3601)
        h.scheduler.run_cycle()
        assert h.job(job_id).state == "SUCCEEDED"
        assert "[dry-run]" in next(e["reason"] for e in h.detail(job_id)["events"] if e["to"] == "RUNNING")
    finally:
        h.stop_runs()


class _LaunchesTogether(DryRunProvider):
    """A dry-run cloud whose launches wait until ``width`` of them are in flight at once (a barrier): a
    scheduler launching one job at a time breaks the barrier and every launch fails."""

    def __init__(self, clock: ManualClock, width: int) -> None:
        super().__init__("aws", clock=clock)
        self.barrier = threading.Barrier(width, timeout=20)
        self.threads: set[str] = set()

    def launch(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.add(threading.current_thread().name)
        self.barrier.wait()
        return super().launch(*args, **kwargs)


def test_launches_run_in_waves_of_the_launch_concurrency_and_each_job_is_launched_once(
        tmp_path: Path, store_url: str) -> None:
    h = Harness(tmp_path, store_url)
    h.aws = _LaunchesTogether(h.clock, width=4)
    h.hb.providers["aws"] = h.aws
    h.scheduler.launch_concurrency = 4
    try:
        ids = h.submit(*(job_doc(f"w-{i}", providers=["aws"]) for i in range(8)))
        assert h.scheduler.run_cycle().provisioned == 8  # two waves of 4, each through the barrier
        for job_id in ids:
            d = h.detail(job_id)
            assert d["state"] == "RUNNING" and [a["outcome"] for a in d["attempts"]] == ["launched"], d
        assert len(h.aws.instances()) == 8 and len(h.aws.threads) == 4, h.aws.threads
    finally:
        h.stop_runs()


@pytest.mark.parametrize(("raw", "expected"), [(None, 1), ("8", 8), ("0", "positive"), ("65", "at most 64"),
                                               ("two", "integer")],
                         ids=["one launch at a time by default", "a width", "zero is refused",
                              "more threads than the cap are refused", "a word is refused"])
def test_the_launch_concurrency_setting(raw: str | None, expected: int | str) -> None:
    from broker.config import load_settings
    from broker.errors import SpecError

    env = {} if raw is None else {"BROKER_SCHEDULER_LAUNCH_CONCURRENCY": raw}
    if isinstance(expected, int):
        assert load_settings(env).launch_concurrency == expected
    else:
        with pytest.raises(SpecError, match=expected) as err:
            load_settings(env)
        assert "BROKER_SCHEDULER_LAUNCH_CONCURRENCY" in str(err.value)


def test_restart_reconciles_instances_by_tag(tmp_path: Path, store_url: str) -> None:
    from broker.model import Capacity, InstanceType, Location, Offer

    first = Harness(tmp_path, store_url)
    a, b = first.submit(job_doc("a", providers=["aws"]), job_doc("b", providers=["aws"]))
    first.scheduler.run_cycle()
    assert first.job(a).state == first.job(b).state == "RUNNING"
    with first.hb.store.tx() as session:  # as if the broker died after launching a, before recording it
        session.connection().execute(sa.update(JobRow.__table__).where(JobRow.__table__.c.id == a)  # type: ignore[attr-defined]
                                     .values(state="PROVISIONING", instances_json=None))
    first.stop_runs()

    survivor = FakeProvider("aws")  # what the cloud still has after the restart
    offer = Offer(InstanceType("m5.large", 2, 8), Location("aws", "us-east-1"), Capacity.ON_DEMAND, 0.1)
    kept = survivor.launch(offer, 1, f"{a}-r0", tags={"hb-job": a})
    orphan = survivor.launch(offer, 1, "gone-r0", tags={"hb-job": "j-never-recorded"})
    second = Harness(tmp_path, store_url, aws=survivor)
    try:
        counts = second.scheduler.reconcile()
        assert counts == {"adopted": 1, "requeued": 1, "terminated": 1}
        assert second.job(a).state == "RUNNING" and kept[0].id in (second.job(a).instances_json or "")
        assert second.job(b).state == "BACKOFF", "b's instance is gone: it is requeued, not lost"
        assert survivor.terminated == [orphan[0].id]
        second.scheduler.run_cycle()
        second.scheduler.run_cycle()
        assert second.job(b).state == "RUNNING", "the scheduler resumes b"
    finally:
        second.stop_runs()


def test_cancel_over_http_terminates_what_runs(tmp_path: Path, store_url: str) -> None:
    h = Harness(tmp_path, store_url)
    try:
        (job_id,) = h.submit(job_doc("c", providers=["aws"]))
        h.scheduler.run_cycle()
        (inst,) = h.aws.running()
        with serve_in_thread(h.app) as url:
            r = httpx.delete(f"{url}/v1/namespaces/{NS}/jobs/{job_id}", headers=ADMIN_H)
        assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
        assert h.aws.terminated == [inst.id] and h.aws.running() == []
        assert h.path(job_id)[-1] == JobState.CANCELLED.value
    finally:
        h.stop_runs()
