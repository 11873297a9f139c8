"""The replay's speed-ups change no decision: a trace replayed through the scheduler as it is, and again with
each shortcut replaced by the plain computation it stands for, gives the same jobs (where, when, at what
price), the same decision records (choice, alternatives, savings baselines, outcome) and so the same waits,
deadline misses and spend.

The shortcuts: placements of deadline-free requests kept across cycles and their baselines computed only
for recorded decisions (reference: a fresh ``place(..., baselines=True)`` for every request of every cycle);
one batched outcome write per cycle (reference: :func:`broker.decisions.record_outcome` per job); the
baselines' per-region totals without building options (reference: :func:`best_per_location`); step 6
reading full rows only of jobs whose instances changed (reference: every RUNNING job's)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from broker.decisions import DecisionRecord
from broker.ops.replay import ReplayResult, replay, synthetic_trace
from broker.store import JobRow, Store

START = datetime(2026, 12, 1, tzinfo=UTC)
FLEET = """\
sites:
  - {name: dc1, continent: eu, uplink_gbps: 10}
hosts:
  - {name: h0, site: dc1, vcpus: 8, memory_gib: 32, owned_usd_per_hour: 0}
  - {name: h1, site: dc1, vcpus: 8, memory_gib: 32, owned_usd_per_hour: 0}
"""
JOBS = 40
QUOTA = {"apiVersion": "hybrid-broker/v1", "kind": "ResourceQuota",
         "metadata": {"name": "q", "namespace": "team-b"}, "spec": {"hard": {"requests.cpu": "24"}}}


def _reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shortcut replaced by the plain computation."""
    import broker.decisions as decisions
    import policies.placement.engine as engine
    from broker.scheduler import Scheduler

    monkeypatch.setattr(Scheduler, "_kept", lambda self, cache_key, extra: None)
    monkeypatch.setattr(Scheduler, "_changed_runs", staticmethod(lambda light, by_provider: [r.id for r in light]))

    def eager_baselines(self: Scheduler, job: Any, result: Any) -> Any:
        cache_key, now, extra = self._inputs[job.id]
        request = dataclasses.replace(cache_key[0], name=job.request.name)
        return self.state.place(request, now=now, extra_offers=extra, top=8, baselines=True).baselines

    monkeypatch.setattr(Scheduler, "_baselines", eager_baselines)

    def one_by_one(session: Any, outcomes: Any, finished_at: datetime) -> int:
        return sum(decisions.record_outcome(session, j, h, finished_at) is not None for j, h in outcomes)

    monkeypatch.setattr(decisions, "record_outcomes", one_by_one)

    def totals_from_options(request: Any, catalog: Any, egress: Any, **kw: Any) -> dict[str, tuple[float, str]]:
        best = engine.best_per_location(request, catalog, egress, **kw)
        return {loc: (o.total_usd, o.site) for loc, o in best.items()}

    monkeypatch.setattr(engine, "best_totals_per_location", totals_from_options)


def _run(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
         ) -> tuple[ReplayResult, dict[str, Any], dict[str, Any], int]:
    from broker.app import AppState

    inv = tmp_path / "fleet.yaml"
    inv.write_text(FLEET)
    trace = synthetic_trace(JOBS, start=START, days=0.07, namespaces=("team-a", "team-b"), seed=7,
                            deadline_fraction=0.5)
    root = tmp_path / name
    root.mkdir()
    calls = [0]
    place = AppState.place

    def counted(self: AppState, *args: Any, **kw: Any) -> Any:
        calls[0] += 1
        return place(self, *args, **kw)

    monkeypatch.setattr(AppState, "place", counted)
    result = replay(trace, inventory=inv, providers=("onprem", "aws", "gcp"), policies=[QUOTA], tick_seconds=300,
                    data_dir=root)
    store = Store(f"sqlite:///{root / 'replay.db'}")
    jobs_t = JobRow.__table__  # type: ignore[attr-defined]
    rec_t = DecisionRecord.__table__  # type: ignore[attr-defined]
    try:
        with store.read() as session:
            names = dict(session.execute(sa.select(jobs_t.c.id, jobs_t.c.name)).all())
            jobs = {r.name: (r.state, r.provider, r.region, r.started_at, r.finished_at, r.retries,
                             json.loads(r.placement_json or "null"), r.held_reason)
                    for r in session.execute(sa.select(jobs_t))}
            records = {}
            for r in session.execute(sa.select(rec_t).order_by(rec_t.c.id)):
                row = dict(r._mapping)
                row.pop("id")
                records.setdefault(names[row.pop("job_id")], []).append(row)
    finally:
        store.dispose()
    return result, jobs, records, calls[0]


def test_the_replay_decides_the_same_with_and_without_its_shortcuts(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        fast, fast_jobs, fast_records, fast_places = _run(tmp_path, "fast", m)
    with monkeypatch.context() as m:
        _reference(m)
        ref, ref_jobs, ref_records, ref_places = _run(tmp_path, "reference", m)
    # the trace exercises what the shortcuts touch: on-prem and cloud, deadlines, outcomes, baselines
    assert fast.jobs == JOBS and fast.succeeded > JOBS * 0.9
    assert {"onprem", "aws"} <= set(fast.jobs_by_provider)
    recorded = [r for rs in fast_records.values() for r in rs if r["baselines"] and r["runtime_hours"] is not None]
    assert len(recorded) > JOBS * 0.6
    assert fast_places < ref_places / 1.5  # the kept placements were used
    assert fast_jobs == ref_jobs
    assert fast_records == ref_records
    for key in ("succeeded", "failed", "unfinished", "deadline_misses", "mean_wait_seconds", "p95_wait_seconds",
                "spend_usd", "spend_by_provider", "jobs_by_provider", "cycles"):
        assert getattr(fast, key) == getattr(ref, key), key
