"""Logs and cancels of on-prem runs across replicas (issue 17): what one replica knows, every replica can serve.

An on-prem run's ``stdout.log``/``stderr.log`` live in the data directory of the replica that runs it. Replicas
on other machines cannot read them, so that replica stores the tail of each stream in ``job_log_tails``
(:class:`broker.store.JobLogTailRow`): while the run runs, at most every :data:`CAPTURE_EVERY_SECONDS` when the
file grew, and once more when it ended (or was cancelled). The logs route serves the file when this replica has
it, else the stored tail (with ``X-Log-Source: stored``, the time it was stored, and the stream's whole size),
else says the logs are not available here yet (never a 200 with an empty body while they exist elsewhere).

A cancel is carried out by a replica that can stop the run (:func:`can_stop_here`): the on-prem pool that knows
the run, or any replica whose provider answers ``terminate`` (a cloud API, Slurm, Ray). Another replica records
``jobs.cancel_requested_at`` and answers 202; :func:`carry_out_cancels`, called by the scheduler leader every
cycle and by every other replica every loop, stops the run and then marks the job CANCELLED. While a cancel is
requested the leader's poll leaves the job alone, so the stop is never mistaken for a crash to retry.

Design choice: stored tails, not a replica-to-replica fetch. Replicas need no address book of each other, no
extra port and no credentials between them; the price is a tail that lags the file by a few seconds while the
run runs (exact once it ended), and at most :data:`STORED_TAIL_BYTES` of each stream.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from broker.errors import BrokerError, NotFoundError
from broker.model import TERMINAL_STATES, JobState
from broker.store import JobLogTailRow, JobRow

__all__ = [
    "STORED_TAIL_BYTES",
    "CAPTURE_EVERY_SECONDS",
    "STREAMS",
    "StoredTail",
    "read_tail",
    "LogCapture",
    "stored_tail",
    "instance_ids",
    "can_stop_here",
    "stop_and_cancel",
    "carry_out_cancels",
]

log = logging.getLogger("broker.job_logs")

STORED_TAIL_BYTES = 64 * 1024  # of each stream of each job's current run (kept after it ends: bounded rows)
CAPTURE_EVERY_SECONDS = 2.0  # at most this often per running job, and only when a stream grew
STREAMS = ("stdout", "stderr")

_jobs = JobRow.__table__  # type: ignore[attr-defined]
_tails = JobLogTailRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class StoredTail:
    """A stored tail: ``data`` (the last bytes), the stream's whole ``size_bytes``, whether the run had
    ``ended``, and when it was stored."""

    data: bytes
    size_bytes: int
    ended: bool
    stored_at: datetime
    instance_id: str


def read_tail(path: Path, limit: int) -> tuple[bytes, int] | None:
    """The last ``limit`` bytes of ``path`` and its size; ``None`` when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read(), size
    except OSError:
        return None


def instance_ids(instances_json: str | None) -> list[str]:
    """The instance ids of a job row's ``instances_json`` (entries are ``{"id": ...}`` objects or bare ids)."""
    return list(_parsed_instance_ids(instances_json)) if instances_json else []


@functools.lru_cache(maxsize=16_384)
def _parsed_instance_ids(text: str) -> tuple[str, ...]:
    """Memoised: the scheduler's step 6 reads every running job's list each cycle."""
    return tuple(i["id"] if isinstance(i, dict) else str(i) for i in json.loads(text) or [])


def _pool_paths(pool: Any, iid: str) -> tuple[Path, Path] | None:
    if pool is None or not hasattr(pool, "logs"):
        return None
    try:
        out, err = pool.logs(iid)
    except NotFoundError:
        return None
    return Path(out), Path(err)


class LogCapture:
    """Stores the tails of on-prem runs this replica runs (one per scheduler: it remembers what it stored)."""

    def __init__(self, limit: int = STORED_TAIL_BYTES, every_seconds: float = CAPTURE_EVERY_SECONDS) -> None:
        self.limit = limit
        self.every_seconds = every_seconds
        self._last: dict[str, tuple[float, tuple[int, int]]] = {}  # job -> (monotonic, stream sizes) stored

    def _paths(self, pool: Any, iid: str) -> tuple[Path, Path] | None:
        return _pool_paths(pool, iid)

    @staticmethod
    def _sizes(paths: tuple[Path, Path]) -> tuple[int, int]:
        out = []
        for p in paths:
            try:
                out.append(p.stat().st_size)
            except OSError:
                out.append(0)
        return out[0], out[1]

    def due(self, pool: Any, job_id: str, iid: str) -> bool:
        """True when a stream of the running ``job_id`` grew since its tail was stored and the last store is
        at least :attr:`every_seconds` old (two ``stat`` calls, no store access)."""
        last = self._last.get(job_id)
        if last is not None and time.monotonic() - last[0] < self.every_seconds:
            return False  # stored recently: no stat (step 6 asks this of every running on-prem run each cycle)
        paths = self._paths(pool, iid)
        if paths is None:
            return False
        sizes = self._sizes(paths)
        return sizes != (0, 0) if last is None else last[1] != sizes

    def capture(self, session: Any, pool: Any, job_id: str, iid: str, *, now: datetime, ended: bool) -> bool:
        """Store (replace) the tails of ``job_id``'s run ``iid`` in ``session``; False when the pool does not know
        the run. ``ended``: the run is over (the stored tail is then its final one)."""
        paths = self._paths(pool, iid)
        if paths is None:
            return False
        tails = [read_tail(p, self.limit) for p in paths]
        session.execute(_tails.delete().where(_tails.c.job_id == job_id))
        session.execute(_tails.insert(), [
            {"job_id": job_id, "stream": stream, "instance_id": iid, "data": tail[0] if tail else b"",
             "size_bytes": tail[1] if tail else 0, "ended": ended, "stored_at": now}
            for stream, tail in zip(STREAMS, tails, strict=True)
        ])
        if ended:
            self._last.pop(job_id, None)
        else:
            self._last[job_id] = (time.monotonic(), (tails[0][1] if tails[0] else 0, tails[1][1] if tails[1] else 0))
        return True

    def retain(self, job_ids: Iterable[str]) -> None:
        """Forget every job but ``job_ids`` (the on-prem jobs running now): memory stays bounded by them."""
        keep = set(job_ids)
        for job_id in [j for j in self._last if j not in keep]:
            del self._last[job_id]


def stored_tail(session: Any, job_id: str, stream: str) -> StoredTail | None:
    """The stored tail of ``stream`` of ``job_id``'s current run, or ``None``."""
    row = session.execute(sa.select(_tails).where(_tails.c.job_id == job_id, _tails.c.stream == stream)).first()
    if row is None:
        return None
    return StoredTail(bytes(row.data), int(row.size_bytes), bool(row.ended), row.stored_at, row.instance_id)


def can_stop_here(providers: dict[str, Any], provider: str | None, ids: list[str]) -> bool:
    """True when this replica can stop the run ``ids`` of ``provider`` itself: the on-prem pool knows every one
    of them (it runs them, or they are in a data directory it shares), or ``provider`` is a remote engine
    (cloud, Slurm, Ray, edge) this replica has. False for on-prem runs of another machine."""
    p = providers.get(provider or "")
    if p is None:
        return False
    if provider != "onprem":
        return True
    try:
        for iid in ids:
            p.instance(iid)
    except NotFoundError:
        return False
    return True


def stop_and_cancel(hb: Any, job_id: str, *, reason: str, capture: LogCapture | None = None,
                    fence: Any = None) -> bool:
    """Stop the run of ``job_id`` (whose cancel was requested: the scheduler's poll leaves it alone), store its
    final log tails, then mark it CANCELLED. Returns False when the stop failed (the request stays pending) or
    the job ended meanwhile. ``fence(session)`` guards the write (the leader's fencing token)."""
    with hb.store.read() as session:
        row = session.execute(sa.select(_jobs.c.state, _jobs.c.provider, _jobs.c.instances_json)
                              .where(_jobs.c.id == job_id)).first()
    if row is None or JobState(row.state) in TERMINAL_STATES:
        return False
    ids = instance_ids(row.instances_json)
    if row.provider and ids:
        try:
            hb.get_provider(row.provider).terminate(ids, f"{job_id}:cancel")
        except BrokerError as exc:
            log.warning("cancel of %s: terminate on %s failed (%s); retried later", job_id, row.provider, exc)
            hb.metrics.provider_errors.labels(row.provider, getattr(exc, "kind", "provider")).inc()
            return False
    now = hb.clock.now()
    from broker.lifecycle import transition

    with hb.store.tx() as session:
        if fence is not None:
            fence(session)
        if row.provider == "onprem" and ids:
            (capture or LogCapture()).capture(session, hb.providers.get("onprem"), job_id, ids[0], now=now,
                                              ended=True)
        current = session.execute(sa.select(_jobs.c.state).where(_jobs.c.id == job_id)).scalar()
        if current is None or JobState(current) in TERMINAL_STATES:
            return False
        transition(session, job_id, JobState.CANCELLED, now=now, reason=reason, finished_at=now)
    hb.metrics.transitions.labels(JobState.CANCELLED.value).inc()
    return True


def carry_out_cancels(hb: Any, *, leader: bool, capture: LogCapture | None = None, fence: Any = None,
                      limit: int = 100) -> int:
    """Carry out the cancels requested through other replicas that this replica can do: the leader every one it
    can stop (:func:`can_stop_here`), another replica only those of on-prem runs its own pool knows. Returns how
    many jobs it cancelled."""
    with hb.store.read() as session:
        rows = list(session.execute(
            sa.select(_jobs.c.id, _jobs.c.provider, _jobs.c.instances_json)
            .where(_jobs.c.state.in_([s.value for s in JobState if s not in TERMINAL_STATES]),
                   _jobs.c.cancel_requested_at.is_not(None))
            .order_by(_jobs.c.id).limit(limit)
        ))
    done = 0
    for r in rows:
        ids = instance_ids(r.instances_json)
        if not leader and not (r.provider == "onprem" and ids):
            continue  # another replica stops only on-prem runs its own pool knows (checked next)
        if (r.provider and ids) and not can_stop_here(hb.providers, r.provider, ids):
            continue
        if stop_and_cancel(hb, r.id, reason="cancelled by user (requested through another replica)",
                           capture=capture, fence=fence if leader else None):
            done += 1
    return done
