"""Health of running work: host and device heartbeats, liveness and readiness probes, and moving work off
what failed -- from its last checkpoint, with the old run fenced so that work never completes twice.

Heartbeats: a host beats with ``POST /v1/ops/heartbeats/host/{name}`` (:func:`record_heartbeat`); an edge
device's heartbeat is its gateway ``last_seen``. A host silent for ``heartbeat_timeout_seconds`` (a device:
``device_timeout_seconds``, off by default since devices work offline and report later) is *lost*: its
epoch grows, an on-prem host is cordoned (no placement), and each of its RUNNING jobs is *re-placed*: the
old run is terminated where the provider can still reach it, and the job goes RUNNING -> PENDING with a
new request id, as a preemption does (:mod:`broker.scheduler`). Its next run starts from the checkpoint
directory it wrote (``spec.checkpoint.path``).

Fencing: the store only ever follows the job's *current* run (its ``request_id`` and
``instances_json``). The old run's instances are no longer the job's, so if the lost host comes back and
its run finishes, nothing reads that result; :meth:`broker.scheduler.Scheduler.reconcile` terminates
instances whose request tag is not the job's current one. A job is SUCCEEDED once, by its current run.

Probes (:mod:`broker.ops.probes`), for RUNNING jobs that declare them, every ``periodSeconds`` of the
clock after ``initialDelaySeconds``: readiness sets ``ready`` in ``probe_states``; ``failureThreshold``
consecutive liveness failures restart the job the same way (RUNNING -> PENDING, old run terminated), or
with ``restartPolicy: Never`` end it FAILED.
Edge runs are probed by the agent on the device (:mod:`edge.agent.executor`), which restarts the task in
place per ``restartPolicy`` and reports its results into ``probe_states`` through the gateway.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from broker.errors import SpecError
from broker.lifecycle import Transition, apply_transitions
from broker.model import JobState
from broker.ops.probes import Probe, probes_of, run_probe
from broker.ops.store import HeartbeatRow, ProbeStateRow
from broker.store import JobRow, utc

__all__ = ["HealthMonitor", "HealthReport", "record_heartbeat", "list_heartbeats"]

log = logging.getLogger("broker.ops.health")

_jobs = JobRow.__table__  # type: ignore[attr-defined]
_beats = HeartbeatRow.__table__  # type: ignore[attr-defined]
_probes = ProbeStateRow.__table__  # type: ignore[attr-defined]

_RUN_COLUMNS = (_jobs.c.id, _jobs.c.namespace, _jobs.c.provider, _jobs.c.region, _jobs.c.placement_json,
                _jobs.c.instances_json, _jobs.c.request_id, _jobs.c.retries, _jobs.c.spec_json, _jobs.c.created_at,
                _jobs.c.started_at, _jobs.c.vcpus, _jobs.c.memory_gib, _jobs.c.gpus, _jobs.c.cancel_requested_at)


def record_heartbeat(session: Any, kind: str, name: str, now: datetime) -> dict[str, Any]:
    """Upsert the heartbeat of ``kind``/``name`` at ``now``; returns its row as a dict."""
    if kind not in ("host", "device"):
        raise SpecError("kind", f"{kind!r}: use host or device")
    if not name or len(name) > 128:
        raise SpecError("name", "expected 1..128 characters")
    row = session.execute(sa.select(_beats).where(_beats.c.kind == kind, _beats.c.name == name)).first()
    if row is None:
        session.execute(sa.insert(_beats).values(kind=kind, name=name, last_seen_at=now, status="alive", epoch=0))
        return {"kind": kind, "name": name, "status": "alive", "epoch": 0}
    session.execute(sa.update(_beats).where(_beats.c.kind == kind, _beats.c.name == name)
                    .values(last_seen_at=max(now, utc(row.last_seen_at))))
    return {"kind": kind, "name": name, "status": row.status, "epoch": row.epoch}


def list_heartbeats(session: Any) -> list[dict[str, Any]]:
    return [{"kind": r.kind, "name": r.name, "status": r.status, "epoch": r.epoch,
             "last_seen_at": utc(r.last_seen_at).isoformat(),
             "lost_at": utc(r.lost_at).isoformat() if r.lost_at else None}
            for r in session.execute(sa.select(_beats).order_by(_beats.c.kind, _beats.c.name))]


@dataclass
class HealthReport:
    lost: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)  # jobs moved off a lost host or device
    restarted: list[str] = field(default_factory=list)  # jobs restarted by a liveness probe
    failed: list[str] = field(default_factory=list)  # jobs failed by a liveness probe (restartPolicy: Never)
    probes_run: int = 0


def _placed_host(placement_json: str | None) -> str | None:
    try:
        return str(json.loads(placement_json or "{}").get("instance_type") or "") or None
    except (ValueError, AttributeError):
        return None


class HealthMonitor:
    """See the module docstring. ``state`` is the app's :class:`broker.app.AppState`."""

    def __init__(self, state: Any, *, heartbeat_timeout_seconds: float = 60.0,
                 device_timeout_seconds: float | None = None, probe_env: dict[str, str] | None = None) -> None:
        self.state = state
        self.heartbeat_timeout_seconds = heartbeat_timeout_seconds
        # Edge devices work offline (a durable outbox reports later), so their jobs are re-placed only
        # when this is set (BROKER_DEVICE_LOST_AFTER_SECONDS); the edge runner's own wait rules apply else.
        self.device_timeout_seconds = device_timeout_seconds
        self.probe_env = probe_env

    def check(self, now: datetime | None = None) -> HealthReport:
        now = now or self.state.clock.now()
        report = HealthReport()
        self._heartbeats(now, report)
        self._run_probes(now, report)
        return report

    # -- heartbeats -------------------------------------------------------------------------------

    def _device_beats(self, session: Any) -> list[tuple[str, datetime]]:
        try:
            from broker.devices import EdgeDeviceRow
        except ImportError:  # pragma: no cover
            return []
        dev = EdgeDeviceRow.__table__  # type: ignore[attr-defined]
        return [(r.id, utc(r.last_seen)) for r in session.execute(
            sa.select(dev.c.id, dev.c.last_seen).where(dev.c.revoked_at.is_(None), dev.c.last_seen.is_not(None)))]

    def _heartbeats(self, now: datetime, report: HealthReport) -> None:
        timeout = self.heartbeat_timeout_seconds
        pool = self.state.providers.get("onprem")
        lost_places: list[tuple[str, str, int]] = []  # (provider, host or device, epoch)
        with self.state.store.read() as session:
            beats = list(session.execute(sa.select(_beats).where(_beats.c.kind == "host")))
            devices = self._device_beats(session) if self.device_timeout_seconds is not None else []
        changes: list[tuple[Any, dict[str, Any]]] = []
        for r in beats:
            silent = (now - utc(r.last_seen_at)).total_seconds()
            if r.status == "alive" and silent > timeout:
                changes.append((r, {"status": "lost", "lost_at": now, "epoch": r.epoch + 1}))
                lost_places.append(("onprem", r.name, r.epoch + 1))
                report.lost.append(f"host/{r.name}")
            elif r.status == "lost" and silent <= timeout:
                changes.append((r, {"status": "alive", "lost_at": None}))
                report.recovered.append(f"host/{r.name}")
                if pool is not None and hasattr(pool, "cordoned"):
                    pool.cordoned.discard(r.name)
            elif r.status == "lost" and pool is not None and hasattr(pool, "cordoned"):
                pool.cordoned.add(r.name)  # after a broker restart the cordon is rebuilt from the store
        if changes:  # a write only when something changed (most cycles change nothing)
            with self.state.store.tx() as session:
                for r, values in changes:
                    session.execute(sa.update(_beats).where(_beats.c.kind == r.kind, _beats.c.name == r.name,
                                                            _beats.c.status == r.status).values(**values))
        for device, seen in devices:
            if (now - seen).total_seconds() > (self.device_timeout_seconds or 0.0):
                lost_places.append(("edge", device, 0))
        if not lost_places:
            return
        if pool is not None and hasattr(pool, "cordoned"):
            pool.cordoned.update(h for p, h, _ in lost_places if p == "onprem")
        with self.state.store.read() as session:
            running = list(session.execute(sa.select(*_RUN_COLUMNS).where(
                _jobs.c.state == JobState.RUNNING.value, _jobs.c.provider.in_(("onprem", "edge")))))
        victims: list[tuple[Any, str, dict[str, Any]]] = []
        for provider, place, epoch in lost_places:
            for row in running:
                if row.provider != provider:
                    continue
                where = _placed_host(row.placement_json) if provider == "onprem" else row.region
                if where == place:
                    kind = "host" if provider == "onprem" else "device"
                    silence = self.heartbeat_timeout_seconds if kind == "host" else self.device_timeout_seconds
                    reason = (f"{kind} {place} lost (no heartbeat for more than {silence:g}s);"
                              " old run fenced, re-placed from its last checkpoint")
                    victims.append((row, reason, {"lost": f"{kind}/{place}", "fenced_epoch": epoch,
                                                  "fenced_request_id": row.request_id}))
        report.replaced += self.requeue(victims, now, "host_lost")

    # -- probes -----------------------------------------------------------------------------------

    def _run_probes(self, now: datetime, report: HealthReport) -> None:
        with self.state.store.read() as session:
            running = list(session.execute(sa.select(*_RUN_COLUMNS).where(
                _jobs.c.state == JobState.RUNNING.value, _jobs.c.spec_json.like('%Probe"%'))))
            if not running:
                return
            states = {(r.job_id, r.probe): r for r in session.execute(sa.select(_probes).where(
                _probes.c.job_id.in_([r.id for r in running])))}
        updates: list[dict[str, Any]] = []
        restart: list[tuple[Any, str, dict[str, Any]]] = []
        fail: list[tuple[Any, str, dict[str, Any]]] = []
        for row in running:
            try:
                spec = json.loads(row.spec_json).get("spec", {})
                probes = probes_of(spec)
            except (SpecError, ValueError, AttributeError):
                continue
            if not probes or row.provider == "edge":  # edge agents run their tasks' probes themselves
                continue
            started = utc(row.started_at) if row.started_at else now
            for key, probe in probes.items():
                name = "liveness" if key == "livenessProbe" else "readiness"
                st = states.get((row.id, name))
                if st is not None and st.request_id != (row.request_id or ""):
                    st = None  # a new run starts its probes afresh
                if (now - started).total_seconds() < probe.initial_delay_seconds:
                    continue
                if st is not None and st.last_at is not None and \
                        (now - utc(st.last_at)).total_seconds() < probe.period_seconds:
                    continue
                result = run_probe(probe, cwd=self._run_dir(row), env=self.probe_env)
                report.probes_run += 1
                failures = 0 if result.ok else (st.failures + 1 if st is not None else 1)
                successes = (st.successes + 1 if st is not None else 1) if result.ok else 0
                ready = bool(st.ready) if st is not None else False
                if name == "readiness":
                    if result.ok and successes >= probe.success_threshold:
                        ready = True
                    elif not result.ok and failures >= probe.failure_threshold:
                        ready = False
                updates.append({"job_id": row.id, "probe": name, "request_id": row.request_id or "",
                                "failures": failures, "successes": successes, "ready": ready, "last_at": now,
                                "message": result.message})
                if name == "liveness" and failures >= probe.failure_threshold:
                    data = {"probe": _probe_text(probe)}
                    if spec.get("restartPolicy", "OnFailure") == "Never":
                        fail.append((row, f"liveness probe failed {failures} times ({result.message}); not "
                                          "restarted (restartPolicy: Never)", data))
                    else:
                        restart.append((row, f"liveness probe failed {failures} times ({result.message}); "
                                             "restarted from its last checkpoint", data))
        if updates:
            with self.state.store.tx() as session:
                for u in updates:
                    session.execute(sa.delete(_probes).where(_probes.c.job_id == u["job_id"],
                                                             _probes.c.probe == u["probe"]))
                session.execute(sa.insert(_probes), updates)
        report.restarted += self.requeue(restart, now, "liveness")
        report.failed += self.requeue(fail, now, "liveness", restart=False)

    def _run_dir(self, row: Any) -> str | None:
        pool = self.state.providers.get("onprem")
        if row.provider != "onprem" or pool is None or not hasattr(pool, "runs_dir"):
            return None
        try:
            ids = json.loads(row.instances_json or "[]")
            iid = ids[0]["id"] if ids and isinstance(ids[0], dict) else (ids[0] if ids else None)
        except (ValueError, KeyError, IndexError, TypeError):
            return None
        if not iid:
            return None
        work = pool.runs_dir / str(iid) / "work"
        return str(work) if os.path.isdir(work) else None

    # -- moving work ------------------------------------------------------------------------------

    def requeue(self, victims: list[tuple[Any, str, dict[str, Any]]], now: datetime, why: str, *,
                restart: bool = True) -> list[str]:
        """Fence each victim's current run and requeue the job (RUNNING -> PENDING, new request id); with
        ``restart=False`` (``restartPolicy: Never``) the job ends FAILED instead, its run charged and its
        placement record given its outcome, as when a run fails by itself."""
        if not victims:
            return []
        from broker.scheduler import _estimate_usd, _instance_ids, _preempted_request_id

        for row, _, _ in victims:  # terminate first: a reachable old run stops before a new one starts
            ids = _instance_ids(row.instances_json)
            if ids and row.provider:
                try:
                    self.state.terminate_instances(row.provider, ids, f"{row.id}:fenced")
                except Exception as exc:  # noqa: BLE001 - an unreachable host cannot be told; the fence holds
                    log.warning("fencing %s of %s failed: %s", ids, row.id, exc)
        sched = self.state.scheduler
        moved: list[str] = []
        with self.state.store.tx() as session:
            ids = [r.id for r, _, _ in victims]
            stmt = sa.select(_jobs.c.id).where(_jobs.c.id.in_(ids), _jobs.c.state == JobState.RUNNING.value)
            if self.state.store.is_postgres:
                stmt = stmt.with_for_update(skip_locked=True)
            live = set(session.execute(stmt).scalars())
            transitions = []
            charged = []
            outcomes: list[tuple[str, float]] = []
            seen: set[str] = set()
            for row, reason, data in victims:
                if row.id not in live or row.id in seen:
                    continue
                seen.add(row.id)
                started = utc(row.started_at) if row.started_at else now
                hours = max(0.0, (now - started).total_seconds() / 3600.0)
                if row.cancel_requested_at is not None:  # never re-place what the user cancelled
                    transitions.append(Transition(
                        row.id, JobState.RUNNING, JobState.CANCELLED, data=data,
                        reason=f"{reason.split(';')[0]}; cancelled as requested (its run was fenced, not re-placed)",
                        fields={"finished_at": now, "message": "cancelled by user"}))
                    continue  # not moved: ended
                if restart:
                    transitions.append(Transition(
                        row.id, JobState.RUNNING, JobState.PENDING, reason=reason, data=data,
                        fields={"instances_json": None, "placement_json": None, "not_before": None,
                                "message": reason,
                                "request_id": _preempted_request_id(row.id, row.retries, row.request_id)},
                    ))
                    charged.append((row, hours, 0.0))  # placed and priced anew: this run is charged in full
                else:
                    transitions.append(Transition(row.id, JobState.RUNNING, JobState.FAILED, reason=reason,
                                                  data=data, fields={"message": reason, "finished_at": now}))
                    charged.append((row, hours, _estimate_usd(row.placement_json)))
                    outcomes.append((row.id, hours))
                moved.append(row.id)
            apply_transitions(session, transitions, now=now)
            if outcomes:
                from broker.decisions import record_outcomes

                record_outcomes(session, outcomes, now)
            if sched is not None:
                sched.charge_runs(session, charged, now)
        for t in transitions:
            self.state.metrics.transitions.labels(t.to_state.value).inc()
            if t.to_state is not JobState.CANCELLED:
                self.state.metrics.failovers.labels(why).inc()
            log.warning("job %s: %s", t.job_id, t.reason)
        return moved


def _probe_text(p: Probe) -> str:
    if p.kind == "exec":
        return "exec " + " ".join(p.command)
    if p.kind == "http":
        return f"httpGet {p.host}:{p.port}{p.path}"
    return f"tcpSocket {p.host}:{p.port}"
