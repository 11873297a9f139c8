"""Capacity planning by trace replay: recorded submissions re-run through the real scheduler
(:class:`broker.scheduler.Scheduler`, with admission, quotas, placement and provisioning) in simulated
time against another fleet (an inventory), quota set (policy documents) or catalog, and a report of
waits, deadline misses and spend.

* :func:`record_trace` reads the submissions of a store (``jobs``: when, namespace, spec), and
  :func:`write_trace` / :func:`read_trace` keep them as JSON lines; :func:`synthetic_trace` makes one.
* :func:`replay` builds a throwaway broker (SQLite in a temporary directory, a :class:`ManualClock` at the
  trace's start) whose clouds are :class:`providers.dryrun.DryRunProvider` and whose on-prem hosts are all
  simulated (no process runs, nothing is launched for real), submits each job at its time, runs scheduler
  cycles every ``tick_seconds`` of simulated time (jumping over idle gaps) and reads the outcome back from
  the store.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from broker.model import JobState
from broker.store import JobRow, NamespaceRow, utc

__all__ = ["TraceJob", "ReplayResult", "record_trace", "write_trace", "read_trace", "synthetic_trace", "replay"]

_jobs = JobRow.__table__  # type: ignore[attr-defined]
_TERMINAL = (JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value)
_OPEN = tuple(s.value for s in JobState if s.value not in _TERMINAL)  # counted by the state index, not a scan


@dataclass(frozen=True)
class TraceJob:
    """One recorded submission: when (UTC), into which namespace, and the job document."""

    at: datetime
    namespace: str
    doc: Mapping[str, Any]


@dataclass
class ReplayResult:
    jobs: int = 0
    succeeded: int = 0
    failed: int = 0
    unfinished: int = 0
    deadline_misses: int = 0
    mean_wait_seconds: float = 0.0
    p95_wait_seconds: float = 0.0
    spend_usd: float = 0.0
    spend_by_provider: dict[str, float] = field(default_factory=dict)
    jobs_by_provider: dict[str, int] = field(default_factory=dict)
    simulated_hours: float = 0.0
    cycles: int = 0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0  # of this process (the machine may be shared)

    def summary(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}


def record_trace(store: Any, *, since: datetime | None = None, until: datetime | None = None) -> list[TraceJob]:
    """The submissions of ``store`` between ``since`` and ``until``, oldest first."""
    stmt = sa.select(_jobs.c.created_at, _jobs.c.namespace, _jobs.c.spec_json).order_by(_jobs.c.created_at, _jobs.c.id)
    if since is not None:
        stmt = stmt.where(_jobs.c.created_at >= since)
    if until is not None:
        stmt = stmt.where(_jobs.c.created_at <= until)
    with store.read() as session:
        return [TraceJob(utc(r.created_at), r.namespace, json.loads(r.spec_json)) for r in session.execute(stmt)]


def write_trace(path: Path, trace: Iterable[TraceJob]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for t in trace:
            f.write(json.dumps({"at": t.at.isoformat(), "namespace": t.namespace, "doc": t.doc}) + "\n")
            n += 1
    return n


def read_trace(path: Path) -> list[TraceJob]:
    from broker.errors import SpecError

    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out.append(TraceJob(utc(datetime.fromisoformat(d["at"])), str(d["namespace"]), d["doc"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise SpecError(f"line {i + 1}", f"not a trace record ({exc})") from None
    return sorted(out, key=lambda t: t.at)


def synthetic_trace(n: int, *, start: datetime, days: float = 1.0, namespaces: Sequence[str] = ("team-a", "team-b"),
                    seed: int = 0, deadline_fraction: float = 0.3) -> list[TraceJob]:
    """``n`` submissions over ``days`` with a daily cycle (most between 08:00 and 18:00), sizes 1-8 vCPU,
    0.25-4 h, a share with deadlines of 1.5-4x their duration."""
    rng = np.random.default_rng(seed)
    hours = rng.uniform(0, 24 * days, 4 * n)
    weight = np.where(((hours % 24) >= 8) & ((hours % 24) < 18), 1.0, 0.25)
    hours = np.sort(rng.choice(hours, n, replace=False, p=weight / weight.sum()))
    out = []
    for i, h in enumerate(hours):
        at = start + timedelta(hours=float(h))
        dur = float(rng.choice([0.25, 0.5, 1, 2, 4]))
        spec: dict[str, Any] = {
            "command": ["train"],
            "resources": {"requests": {"cpu": str(int(rng.choice([1, 2, 4, 8]))),
                                       "memory": f"{int(rng.choice([2, 4, 8, 16]))}Gi"}},
            "durationHours": dur,
            "placement": {"spot": "allowed" if rng.uniform() < 0.5 else "never"},
        }
        if rng.uniform() < deadline_fraction:
            spec["deadline"] = (at + timedelta(hours=dur * float(rng.uniform(1.5, 4)))).isoformat()
        out.append(TraceJob(at, str(namespaces[i % len(namespaces)]),
                            {"apiVersion": "hybrid-broker/v1", "kind": "Job",
                             "metadata": {"name": f"job-{i}"}, "spec": spec}))
    return out


def _replay_cloud(name: str, clock: Any) -> Any:
    """A :class:`providers.dryrun.DryRunProvider` that forgets a run once it is terminated: the scheduler
    lists instances every cycle, and a replay of 10,000 jobs must not list every run it ever made."""
    from broker.model import InstanceState
    from providers.dryrun import DryRunProvider

    class ReplayCloud(DryRunProvider):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._listed: dict[str, Any] = {}  # run -> its Instance as last listed (rebuilt on a state change)

        def instances(self, tags: Mapping[str, str] | None = None) -> list[Any]:
            if tags:
                return super().instances(tags)
            now = self._clock.now()
            out = []
            with self._lock:
                for iid, run in self._runs.items():
                    seen = self._listed.get(iid)
                    if seen is None or (seen.state is InstanceState.RUNNING and now >= run.ends_at):
                        seen = self._listed[iid] = self._state(run)
                    out.append(seen)
            return out

        def terminate(self, ids: Sequence[str], request_id: str) -> None:
            with self._lock:
                for iid in ids:
                    self._runs.pop(iid, None)
                    self._listed.pop(iid, None)

    return ReplayCloud(name, clock=clock)


def _simulated(inventory: Any) -> Any:
    hosts = tuple(dataclasses.replace(h, local=False) for h in inventory.hosts)
    return dataclasses.replace(inventory, hosts=hosts)


def replay(trace: Sequence[TraceJob], *, inventory: str | Path | None = None,
           policies: Sequence[Mapping[str, Any]] = (), providers: Sequence[str] = ("onprem", "aws", "azure", "gcp"),
           catalog: Any = None,
           tick_seconds: float = 300.0, max_hours_after: float = 72.0, data_dir: Path | None = None) -> ReplayResult:
    """Replay ``trace`` (see the module docstring). ``inventory`` is an inventory YAML (the fleet),
    ``policies`` are policy documents (ResourceQuota, Budget, PriorityClass...), ``catalog`` a
    :class:`pricing.Catalog` (default: the bundled one). Stops ``max_hours_after`` the last submission."""
    import pricing
    from broker.app import create_app
    from broker.clock import ManualClock
    from broker.config import load_settings
    from broker.lifecycle import submit_jobs
    from broker.spec import parse_job_spec
    from providers.onprem import OnPremPool

    wall = time.perf_counter()
    cpu = time.process_time()
    result = ReplayResult(jobs=len(trace))
    if not trace:
        return result
    trace = sorted(trace, key=lambda t: t.at)
    tmp = tempfile.TemporaryDirectory(prefix="hb-replay-") if data_dir is None else None
    root = Path(tmp.name) if tmp is not None else Path(data_dir)  # type: ignore[arg-type]
    try:
        clock = ManualClock(trace[0].at)
        inv = _simulated(pricing.load_inventory(inventory)) if inventory else None
        settings = load_settings({}, data_dir=root / "data", database_url=f"sqlite:///{root / 'replay.db'}",
                                 admin_token="hb_replay_admin", scheduler_enabled=False, providers=tuple(providers),
                                 dry_run_speedup=1.0, scheduler_batch=2000,
                                 **({"inventory": Path(inventory)} if inventory else {}))
        provs: dict[str, Any] = {}
        for name in providers:
            if name == "onprem":
                if inv is not None:
                    provs[name] = OnPremPool(inv, settings.data_dir, clock=clock)
            else:
                provs[name] = _replay_cloud(name, clock)
        cat = catalog if catalog is not None else pricing.load_catalog(None)
        egress = pricing.load_egress(None, sites=inv.sites if inv is not None else ())
        app = create_app(settings, clock=clock, providers=provs, catalog=cat, egress=egress)
        hb = app.state.hb
        hb.scheduler.cycle_hooks.clear()  # the replay measures the scheduler, not the operations loop
        with hb.store.tx() as session:
            for ns in sorted({t.namespace for t in trace}):
                session.add(NamespaceRow(name=ns, created_at=clock.now()))
        if policies:
            from broker.policy_store import apply_documents

            with hb.store.tx() as session:
                apply_documents(session, list(policies), now=clock.now())
        i = 0
        end = trace[-1].at + timedelta(hours=max_hours_after)
        while True:
            now = clock.now()
            batch: dict[str, list[tuple[Any, str]]] = defaultdict(list)
            while i < len(trace) and trace[i].at <= now:
                t = trace[i]
                spec = parse_job_spec(t.doc, now=t.at, default_namespace=t.namespace)
                batch[t.namespace].append((spec, json.dumps(t.doc)))
                i += 1
            if batch:
                with hb.store.tx() as session:
                    for ns, items in batch.items():
                        submit_jobs(session, ns, [s for s, _ in items], now=now, spec_docs=[d for _, d in items])
            hb.scheduler.run_cycle()
            result.cycles += 1
            with hb.store.read() as session:
                open_jobs = session.execute(sa.select(sa.func.count()).where(_jobs.c.state.in_(_OPEN))).scalar()
            if i >= len(trace) and not open_jobs:
                break
            if now >= end:
                break
            step = tick_seconds
            if not open_jobs and i < len(trace):  # idle: jump to the next submission
                step = max(tick_seconds, (trace[i].at - now).total_seconds())
            clock.advance(step)
        result.simulated_hours = (clock.now() - trace[0].at).total_seconds() / 3600.0
        _read_outcome(hb.store, result)
        hb.store.dispose()
    finally:
        if tmp is not None:
            tmp.cleanup()
    result.wall_seconds = time.perf_counter() - wall
    result.cpu_seconds = time.process_time() - cpu
    return result


def _read_outcome(store: Any, result: ReplayResult) -> None:
    from broker.scheduler import _run_cost

    waits: list[float] = []
    with store.read() as session:
        rows = session.execute(sa.select(_jobs.c.state, _jobs.c.created_at, _jobs.c.started_at, _jobs.c.finished_at,
                                         _jobs.c.provider, _jobs.c.placement_json, _jobs.c.spec_json))
        for r in rows:
            if r.state == JobState.SUCCEEDED.value:
                result.succeeded += 1
            elif r.state in (JobState.FAILED.value, JobState.CANCELLED.value):
                result.failed += 1
            else:
                result.unfinished += 1
            doc = json.loads(r.spec_json).get("spec", {})
            deadline = doc.get("deadline")
            if deadline:
                due = utc(datetime.fromisoformat(str(deadline).replace("Z", "+00:00")))
                if r.state != JobState.SUCCEEDED.value or r.finished_at is None or utc(r.finished_at) > due:
                    result.deadline_misses += 1
            if r.started_at is not None:
                waits.append((utc(r.started_at) - utc(r.created_at)).total_seconds())
            if r.started_at is not None and r.finished_at is not None and r.provider:
                hours = (utc(r.finished_at) - utc(r.started_at)).total_seconds() / 3600.0
                usd = _run_cost(r.placement_json, hours, int(doc.get("nodes", 1) or 1))
                result.spend_usd += usd
                result.spend_by_provider[r.provider] = result.spend_by_provider.get(r.provider, 0.0) + usd
                result.jobs_by_provider[r.provider] = result.jobs_by_provider.get(r.provider, 0) + 1
    if waits:
        result.mean_wait_seconds = float(np.mean(waits))
        result.p95_wait_seconds = float(np.percentile(waits, 95))
