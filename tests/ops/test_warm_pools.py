"""Warm pools in use and consolidation carried out, end to end through the real scheduler and the fleet
operations loop on a real store, with the dry-run provider on a manual clock (its runs end by time):

* jobs of the pool's namespace run on the pool's warm instances (priced at the pool's price, shown in the
  decision record), jobs of another namespace get instances of their own; scale-in removes the idle
  instance and keeps the one running work, even when it is the newest;
* consolidation moves the work of an under-used instance onto another (checkpoint, new request id), releases
  the emptied instance, respects the disruption budget and the scale-out threshold, and every job finishes
  exactly once.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from broker.clock import ManualClock
from broker.decisions import DecisionRecord
from broker.lifecycle import submit_jobs
from broker.ops.autoscale import list_pools, put_pool
from broker.spec import parse_job_spec
from broker.store import JobEventRow, JobRow, NamespaceRow
from providers.base import TAG_ON, TAG_POOL
from providers.dryrun import DryRunProvider
from tests.broker.service_support import job_doc, make_app

START = datetime(2026, 12, 1, 9, tzinfo=UTC)
_jobs = JobRow.__table__  # type: ignore[attr-defined]
_events = JobEventRow.__table__  # type: ignore[attr-defined]


def _pool(name: str, *, lo: int, hi: int, consolidation: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "namespace": "team", "provider": "aws", "region": "us-east-1",
        "instanceType": {"name": "m7i.2xlarge", "vcpus": 8, "memoryGiB": 32, "hourlyUSD": 0.4032},
        "minReplicas": lo, "maxReplicas": hi, "cooldownSeconds": 0, "stabilizationWindowSeconds": 0,
    }
    if consolidation is not None:
        spec["consolidation"] = consolidation
    return {"kind": "Pool", "metadata": {"name": name}, "spec": spec}


def _app(tmp_path: Path) -> tuple[Any, ManualClock, DryRunProvider]:
    clock = ManualClock(START)
    aws = DryRunProvider("aws", clock=clock)
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'w.db'}", clock=clock, providers={"aws": aws})
    return app.state.hb, clock, aws


def _submit(hb: Any, clock: ManualClock, namespace: str, docs: list[dict[str, Any]]) -> list[str]:
    with hb.store.tx() as session:
        if not session.get(NamespaceRow, namespace):
            session.add(NamespaceRow(name=namespace, created_at=clock.now()))
            session.flush()
        out = submit_jobs(session, namespace, [parse_job_spec(d, now=clock.now()) for d in docs], now=clock.now(),
                          spec_docs=[json.dumps(d) for d in docs])
    return [o["id"] for o in out]


def _jobs_by_name(hb: Any) -> dict[str, Any]:
    with hb.store.read() as session:
        return {r.name: r for r in session.execute(sa.select(_jobs))}


def _vms(aws: DryRunProvider, pool: str) -> list[str]:
    """The pool's instances that are up, oldest first."""
    return [i.id for i in aws.instances({TAG_POOL: pool}) if i.state.value == "running"]


def _cycle_until(hb: Any, clock: ManualClock, until: datetime, step: float = 300.0) -> None:
    while clock.now() < until:
        clock.advance(step)
        hb.scheduler.run_cycle()


def test_jobs_run_on_the_warm_instances_and_scale_in_keeps_the_busy_one(tmp_path: Path) -> None:
    hb, clock, aws = _app(tmp_path)
    with hb.store.tx() as session:
        put_pool(session, "warm", _pool("warm", lo=2, hi=4), clock.now())
    hb.ops.autoscaler.reconcile(clock.now())
    vm0, vm1 = _vms(aws, "warm")
    from providers.sweeper import find_orphans

    assert find_orphans(aws, set(), clock.now() + timedelta(hours=1), 0) == []  # the sweeper leaves them be
    # A (6 vCPU) fills vm0 best-fit; B (4 vCPU) no longer fits there and goes to vm1, the newest instance
    _submit(hb, clock, "team", [job_doc("a", cpu="6", memory="8Gi", hours=0.5),
                                job_doc("b", cpu="4", memory="8Gi", hours=2)])
    _submit(hb, clock, "other", [job_doc("c", cpu="2", memory="4Gi", hours=0.5)])
    hb.scheduler.run_cycle()
    jobs = _jobs_by_name(hb)
    assert {n: jobs[n].state for n in "abc"} == {"a": "RUNNING", "b": "RUNNING", "c": "RUNNING"}
    placed = {n: json.loads(jobs[n].placement_json) for n in "abc"}
    assert placed["a"]["pool_instance"] == vm0 and placed["b"]["pool_instance"] == vm1
    assert placed["a"]["pool"] == "warm" and placed["a"]["hourly_usd"] == 0.4032
    assert "pool" not in placed["c"]  # another namespace: an instance of its own
    runs = {i.id: i for i in aws.instances()}
    (a_run,) = json.loads(jobs["a"].instances_json)
    assert runs[a_run["id"]].tags[TAG_ON] == vm0
    own = [i for i in runs.values() if TAG_POOL not in i.tags and TAG_ON not in i.tags]
    assert len(own) == 1 and own[0].tags["hb-job"] == jobs["c"].id  # only c got a new instance
    # a restart's reconciliation keeps the pool's instances and the runs on them
    assert hb.scheduler.reconcile()["terminated"] == 0 and _vms(aws, "warm") == [vm0, vm1]
    assert all(i.state.value == "running" for i in aws.instances({"hb-job": jobs["a"].id}))
    with hb.store.read() as session:
        rec = session.execute(sa.select(DecisionRecord.__table__).where(  # type: ignore[attr-defined]
            DecisionRecord.__table__.c.job_id == jobs["a"].id)).one()  # type: ignore[attr-defined]
    assert rec.chosen["hourly_usd"] == 0.4032 and rec.chosen["instance_type"] == "m7i.2xlarge"
    assert "warm pool warm" in rec.explanation and "already paid" in rec.explanation

    # the pool may shrink to 0; A ends: 4 of 16 vCPU busy -> desired 1, and the instance that goes is the
    # idle vm0 (the oldest), never vm1 with B on it
    with hb.store.tx() as session:
        put_pool(session, "warm", _pool("warm", lo=0, hi=4), clock.now())
    _cycle_until(hb, clock, START + timedelta(hours=0.75))
    jobs = _jobs_by_name(hb)
    assert jobs["a"].state == "SUCCEEDED" and jobs["b"].state == "RUNNING"
    assert _vms(aws, "warm") == [vm1]
    (pool,) = [p for p in list_pools_of(hb) if p["name"] == "warm"]
    assert pool["instances"] == [vm1]
    _cycle_until(hb, clock, START + timedelta(hours=2.5))
    jobs = _jobs_by_name(hb)
    assert jobs["b"].state == "SUCCEEDED" and _vms(aws, "warm") in ([vm1], [])


def list_pools_of(hb: Any) -> list[dict[str, Any]]:
    with hb.store.read() as session:
        return list_pools(session)


def test_consolidation_moves_work_off_an_under_used_instance_and_releases_it(tmp_path: Path) -> None:
    hb, clock, aws = _app(tmp_path)
    with hb.store.tx() as session:
        put_pool(session, "cons", _pool("cons", lo=3, hi=3), clock.now())
    hb.ops.autoscaler.reconcile(clock.now())
    vms = _vms(aws, "cons")
    assert len(vms) == 3
    ck = {"checkpoint": {"path": str(tmp_path / "ck")}}
    # fillers (6 vCPU, 15 min) spread the long jobs (2 vCPU, 2 h) one per instance
    docs = []
    for k in range(3):
        docs += [job_doc(f"f{k}", cpu="6", memory="4Gi", hours=0.25, **ck),
                 job_doc(f"l{k}", cpu="2", memory="4Gi", hours=2, **ck)]
    for d in docs:  # one at a time, in order: the queue is ordered by id within a burst
        _submit(hb, clock, "team", [d])
    hb.scheduler.run_cycle()
    jobs = _jobs_by_name(hb)
    on = {n: json.loads(jobs[n].placement_json)["pool_instance"] for n in ("l0", "l1", "l2")}
    assert sorted(on.values()) == sorted(vms)  # one long job per instance
    _cycle_until(hb, clock, START + timedelta(hours=0.3))
    assert all(_jobs_by_name(hb)[f"f{k}"].state == "SUCCEEDED" for k in range(3))
    assert len(_vms(aws, "cons")) == 3  # 6 of 24 vCPU busy, but scale-in never removes busy instances

    with hb.store.tx() as session:  # the operator allows fewer instances and turns consolidation on
        put_pool(session, "cons", _pool("cons", lo=1, hi=3, consolidation={
            "enabled": True, "maxDisrupted": 1, "cooldownSeconds": 0}), clock.now())
    moved_at = clock.now() + timedelta(seconds=300)
    _cycle_until(hb, clock, moved_at)
    left = _vms(aws, "cons")
    assert len(left) == 2  # one instance per round (the disruption budget)
    (gone,) = set(vms) - set(left)
    victim = next(n for n, vm in on.items() if vm == gone)
    assert any(f"consolidation: released {gone}" in d["reason"] for d in pool_decisions(hb, "cons"))
    _cycle_until(hb, clock, START + timedelta(hours=1))
    # stable at 2: one more release would put 6 vCPU on 8 (75 % > the 70 % scale-out threshold)
    assert sorted(_vms(aws, "cons")) == sorted(left)
    jobs = _jobs_by_name(hb)
    assert jobs[victim].state == "RUNNING"
    assert json.loads(jobs[victim].placement_json)["pool_instance"] in left
    (pool,) = list_pools_of(hb)
    assert sorted(pool["instances"]) == sorted(left) and pool["desired"] == 2

    _cycle_until(hb, clock, START + timedelta(hours=3))
    jobs = _jobs_by_name(hb)
    assert all(jobs[n].state == "SUCCEEDED" for n in jobs)
    with hb.store.read() as session:
        events = list(session.execute(sa.select(_events).order_by(_events.c.id)))
    by_job: dict[str, list[Any]] = {}
    for e in events:
        by_job.setdefault(e.job_id, []).append(e)
    for name, row in jobs.items():  # every job finished exactly once
        assert sum(1 for e in by_job[row.id] if e.to_state == "SUCCEEDED") == 1, name
    moves = [e for e in by_job[jobs[victim].id] if e.from_state == "RUNNING" and e.to_state == "PENDING"]
    assert len(moves) == 1 and f"instance {gone} under-used" in moves[0].reason
    fenced = json.loads(moves[0].data_json)["fenced_request_id"]
    old_runs = [i for i in aws.instances({"hb-request": fenced})]
    assert old_runs and all(i.state.value == "terminated" for i in old_runs)  # the old run was stopped
    assert jobs[victim].request_id != fenced
    assert all(TAG_POOL in i.tags or TAG_ON in i.tags for i in aws.instances())  # nothing new provisioned
    assert 'hb_consolidation_total{pool="cons"} 1.0' in hb.metrics.render().decode()


def pool_decisions(hb: Any, name: str) -> list[dict[str, Any]]:
    from broker.ops.store import PoolRow

    with hb.store.read() as session:
        row = session.execute(sa.select(PoolRow.__table__).where(  # type: ignore[attr-defined]
            PoolRow.__table__.c.name == name)).one()  # type: ignore[attr-defined]
    return list(json.loads(row.recommendations_json))


def test_a_bad_consolidation_block_is_refused() -> None:
    import pytest

    from broker.errors import SpecError
    from broker.ops.autoscale import parse_pool

    doc = _pool("p", lo=1, hi=3, consolidation={"enabled": True, "budget": 2})
    with pytest.raises(SpecError, match="spec.consolidation.budget"):
        parse_pool(yaml.safe_load(yaml.safe_dump(doc)), "p")
    with pytest.raises(SpecError, match="spec.consolidation.maxDisrupted"):
        parse_pool(_pool("p", lo=1, hi=3, consolidation={"maxDisrupted": 0}), "p")
