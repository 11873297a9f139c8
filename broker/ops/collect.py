"""The fleet collector: each scheduler cycle (at most every ``export_seconds``, 5) it reads what runs (the
store, the on-prem pool, the edge devices), sets the Prometheus gauges of :class:`broker.metrics.Metrics`
and, at most every ``interval_seconds`` of the app's clock, keeps the same values as samples in the store for history,
alerts, forecasts and planning.

Every sample carries its place in the topology as labels (``provider``, ``region``, ``site``, ``host`` or
``device``), which is what :mod:`broker.ops.topology` groups alerts by.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from broker.model import JobState
from broker.ops.samples import Sample, record
from broker.store import JobRow, utc

__all__ = ["Collector", "fleet_samples"]

_jobs = JobRow.__table__  # type: ignore[attr-defined]


def _hourly(placement_json: str | None) -> float:
    try:
        return float(json.loads(placement_json or "{}").get("hourly_usd", 0.0))
    except (ValueError, TypeError, AttributeError):
        return 0.0


def fleet_samples(state: Any, now: datetime) -> list[Sample]:
    """What the fleet looks like now, as samples (see the module docstring for the label scheme)."""
    out: list[Sample] = []
    pool = state.providers.get("onprem")
    if pool is not None and hasattr(pool, "free"):
        free = pool.free()
        for h in getattr(pool, "_hosts", []):
            f = free.get(h.name)
            if f is None:
                continue
            labels = {"scope": "host", "provider": "onprem", "region": h.site, "host": h.name}
            for resource, cap, left in (("cpu", h.vcpus, f["vcpus"]), ("memory", h.memory_gib, f["memory_gib"]),
                                        ("gpu", h.gpus, f["gpus"])):
                if cap > 0:
                    out.append(Sample("utilization", {**labels, "resource": resource},
                                      min(1.0, max(0.0, 1.0 - left / cap)), now))
    with state.store.read() as session:
        by_state = session.execute(
            sa.select(_jobs.c.namespace, _jobs.c.state, sa.func.count(), sa.func.min(_jobs.c.created_at))
            .group_by(_jobs.c.namespace, _jobs.c.state)
        ).all()
        running = session.execute(
            sa.select(_jobs.c.namespace, _jobs.c.provider, _jobs.c.region, _jobs.c.placement_json,
                      _jobs.c.spec_json)
            .where(_jobs.c.state == JobState.RUNNING.value)
        ).all()
        devices: list[Any] = []
        try:
            from broker.devices import EdgeDeviceRow

            dev = EdgeDeviceRow.__table__  # type: ignore[attr-defined]
            devices = session.execute(
                sa.select(dev.c.id, dev.c.namespace, dev.c.latency_ms, dev.c.online)
                .where(dev.c.revoked_at.is_(None))
            ).all()
        except (ImportError, sa.exc.SQLAlchemyError):  # pragma: no cover - edge tables missing
            devices = []
    pending: dict[str, tuple[int, datetime | None]] = {}
    for ns, st, n, oldest in by_state:
        out.append(Sample("jobs", {"namespace": ns, "state": st}, float(n), now))
        if st == JobState.PENDING.value:
            pending[ns] = (int(n), utc(oldest) if oldest is not None else None)
    for ns, (n, oldest) in pending.items():
        out.append(Sample("queue_length", {"namespace": ns}, float(n), now))
        wait = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
        out.append(Sample("queue_wait_seconds", {"namespace": ns}, wait, now))
    burn: dict[tuple[str, str], float] = defaultdict(float)
    for r in running:
        nodes = 1
        try:
            nodes = int(json.loads(r.spec_json).get("spec", {}).get("nodes", 1) or 1)
        except (ValueError, TypeError, AttributeError):
            nodes = 1
        burn[(r.namespace, r.provider or "")] += _hourly(r.placement_json) * nodes
    for (ns, provider), usd in burn.items():
        out.append(Sample("spend_usd_per_hour", {"namespace": ns, "provider": provider}, usd, now))
    for d in devices:
        if d.latency_ms is not None:
            out.append(Sample("edge_link_latency_seconds",
                              {"scope": "device", "provider": "edge", "region": d.namespace, "device": d.id},
                              float(d.latency_ms) / 1000.0, now))
    return out


class Collector:
    """Sets the gauges at most every ``export_seconds`` and stores samples every ``interval_seconds`` (see the
    module docstring).

    ``extra`` are more sample sources (the pool autoscaler adds its pools' utilization)."""

    def __init__(self, state: Any, *, interval_seconds: float = 60.0, export_seconds: float = 5.0) -> None:
        self.state = state
        self.interval_seconds = interval_seconds
        self.export_seconds = export_seconds
        self.extra: list[Any] = []
        self._last: datetime | None = None
        self._last_export: datetime | None = None

    def __call__(self, now: datetime | None = None) -> list[Sample]:
        """Collect now, unless the gauges were set less than ``export_seconds`` ago (a busy scheduler runs
        cycles back to back; the fleet is read at most that often)."""
        now = now or self.state.clock.now()
        if self._last_export is not None and 0 <= (now - self._last_export).total_seconds() < self.export_seconds:
            return []
        self._count_starts(self._last_export, now)
        self._last_export = now
        samples = fleet_samples(self.state, now)
        for source in self.extra:
            samples.extend(source(now))
        self._export(samples)
        if self._last is None or (now - self._last).total_seconds() >= self.interval_seconds:
            with self.state.store.tx() as session:
                record(session, samples)
            self._last = now
        return samples

    def _count_starts(self, since: datetime | None, now: datetime) -> None:
        """Runs that started in ``(since, now]``: their provisioning latency (PLACED -> RUNNING) and the data
        they moved (inputs stored at another provider: ``hb_network_bytes`` by source and destination)."""
        from broker.store import JobEventRow

        ev = JobEventRow.__table__  # type: ignore[attr-defined]
        stmt = sa.select(ev.c.job_id, ev.c.at).where(ev.c.to_state == JobState.RUNNING.value, ev.c.at <= now)
        if since is not None:
            stmt = stmt.where(ev.c.at > since)
        with self.state.store.read() as session:
            started = {r.job_id: utc(r.at) for r in session.execute(stmt.limit(10_000))}
            if not started:
                return
            ids = list(started)
            placed = dict(session.execute(
                sa.select(ev.c.job_id, sa.func.max(ev.c.at)).where(ev.c.job_id.in_(ids),
                                                                   ev.c.to_state == JobState.PLACED.value)
                .group_by(ev.c.job_id)).all())
            jobs = session.execute(sa.select(_jobs.c.id, _jobs.c.provider, _jobs.c.spec_json)
                                   .where(_jobs.c.id.in_(ids))).all()
        m = self.state.metrics
        for job_id, at in started.items():
            if job_id in placed:
                m.provisioning_latency.observe(max(0.0, (at - utc(placed[job_id])).total_seconds()))
        for j in jobs:
            try:
                data = json.loads(j.spec_json).get("spec", {}).get("data") or []
            except (ValueError, AttributeError):
                continue
            for d in data:
                src = str(d.get("location", "")).split(":", 1)[0] if isinstance(d, dict) else ""
                size = float(d.get("sizeGiB", 0) or 0) if isinstance(d, dict) else 0.0
                if src and j.provider and src != j.provider and size > 0:
                    m.network_bytes.labels(src, j.provider).inc(size * 2**30)

    def _export(self, samples: list[Sample]) -> None:
        m = self.state.metrics
        m.queue_length.clear()
        m.queue_wait_oldest.clear()
        m.spend_burn.clear()
        for s in samples:
            lb = s.labels
            if s.name == "utilization":
                name = lb.get("host") or lb.get("device") or lb.get("pool") or ""
                m.utilization.labels(lb.get("scope", ""), name, lb.get("resource", "")).set(s.value)
            elif s.name == "queue_length":
                m.queue_length.labels(lb["namespace"]).set(s.value)
            elif s.name == "queue_wait_seconds":
                m.queue_wait_oldest.labels(lb["namespace"]).set(s.value)
            elif s.name == "spend_usd_per_hour":
                m.spend_burn.labels(lb["namespace"], lb["provider"]).set(s.value)
            elif s.name == "edge_link_latency_seconds":
                m.edge_link_latency.labels(lb["device"]).set(s.value)
            elif s.name == "pool_replicas":
                m.pool_replicas.labels(lb["pool"], lb.get("kind", "current")).set(s.value)
