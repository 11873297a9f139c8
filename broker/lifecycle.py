"""The job lifecycle: the only code that changes a job's state.

Contract:

* Only the transitions of :data:`broker.model.ALLOWED_TRANSITIONS` are possible; anything else raises
  :class:`~broker.errors.ConflictError` and changes nothing.
* Every transition writes exactly one :class:`~broker.store.JobEventRow` in the caller's transaction, the
  same one that changes the state, so history and state never disagree.
* Updates are guarded by the expected source state (``WHERE id = ? AND state = ?``): a concurrent change
  makes the transition fail instead of silently overwriting it.

:func:`submit_jobs` inserts new PENDING jobs (with their submission events and labels) in bulk;
:func:`apply_transitions` moves many jobs in a few statements (what the scheduler uses).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from broker.errors import ConflictError, NotFoundError
from broker.model import ALLOWED_TRANSITIONS, JobSpec, JobState
from broker.store import JobEventRow, JobLabelRow, JobRow, new_job_id

__all__ = ["Transition", "transition", "apply_transitions", "note", "submit_jobs", "UPDATABLE_FIELDS"]

_jobs = JobRow.__table__  # type: ignore[attr-defined]
_events = JobEventRow.__table__  # type: ignore[attr-defined]
_labels = JobLabelRow.__table__  # type: ignore[attr-defined]

# Columns a transition may set besides state/updated_at.
UPDATABLE_FIELDS = frozenset(
    {
        "not_before",
        "started_at",
        "finished_at",
        "placement_json",
        "provider",
        "region",
        "dry_run",
        "instances_json",
        "request_id",
        "retries",
        "held_reason",
        "message",
        "exit_code",
    }
)


@dataclass(frozen=True)
class Transition:
    """Move job ``job_id`` from ``from_state`` to ``to_state``; ``fields`` are extra column values
    (names in :data:`UPDATABLE_FIELDS`), ``reason`` and ``data`` go to the event row."""

    job_id: str
    from_state: JobState
    to_state: JobState
    reason: str = ""
    data: Mapping[str, Any] | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)


def _check(t: Transition) -> None:
    if t.to_state not in ALLOWED_TRANSITIONS[t.from_state]:
        raise ConflictError(
            f"job {t.job_id} cannot go from {t.from_state.value} to {t.to_state.value}. To fix: only "
            f"{', '.join(sorted(s.value for s in ALLOWED_TRANSITIONS[t.from_state])) or 'nothing'} "
            f"may follow {t.from_state.value}"
        )
    bad = set(t.fields) - UPDATABLE_FIELDS
    if bad:
        raise ValueError(f"a transition cannot set {sorted(bad)}; allowed: {sorted(UPDATABLE_FIELDS)}")


def _event(t: Transition, now: datetime) -> dict[str, Any]:
    return {
        "job_id": t.job_id,
        "at": now,
        "from_state": t.from_state.value,
        "to_state": t.to_state.value,
        "reason": t.reason,
        "data_json": None if t.data is None else json.dumps(t.data, default=str),
    }


def _chained(transitions: Sequence[Transition]) -> Sequence[Transition]:
    """The row updates of ``transitions``: a job's consecutive transitions in one batch (e.g. PENDING -> PLACED
    -> PROVISIONING) become one guarded update from its first source state to its last target state with
    their fields merged (later ones win), which leaves the row as updating it once per transition would.
    Unchanged when some job's transitions do not form one chain."""
    merged: dict[str, Transition] = {}
    chained = False
    for t in transitions:
        seen = merged.get(t.job_id)
        if seen is None:
            merged[t.job_id] = t
        elif seen.to_state is t.from_state:
            merged[t.job_id] = Transition(t.job_id, seen.from_state, t.to_state, fields={**seen.fields, **t.fields})
            chained = True
        else:
            return transitions
    return list(merged.values()) if chained else transitions


def apply_transitions(session: Session, transitions: Sequence[Transition], *, now: datetime) -> None:
    """Apply ``transitions`` in the caller's transaction: one guarded UPDATE per distinct field set
    (executemany) and one bulk INSERT of events. Raises :class:`ConflictError` when a transition is not
    allowed or a job was not in its expected source state (the caller's transaction must then roll back).
    """
    if not transitions:
        return
    for t in transitions:
        _check(t)
    groups: dict[tuple[str, ...], list[Transition]] = {}
    for t in _chained(transitions):
        groups.setdefault(tuple(sorted(t.fields)), []).append(t)
    conn = session.connection()
    sane_rowcount = conn.dialect.supports_sane_multi_rowcount
    for keys, items in groups.items():
        values: dict[str, Any] = {"state": sa.bindparam("p_to"), "updated_at": sa.bindparam("p_now")}
        values.update({k: sa.bindparam(f"p_{k}") for k in keys})
        stmt = (
            _jobs.update()
            .where(_jobs.c.id == sa.bindparam("p_id"), _jobs.c.state == sa.bindparam("p_from"))
            .values(values)
        )
        params = [
            {"p_id": t.job_id, "p_from": t.from_state.value, "p_to": t.to_state.value, "p_now": now}
            | {f"p_{k}": t.fields[k] for k in keys}
            for t in items
        ]
        result = conn.execute(stmt, params)
        if (len(params) == 1 or sane_rowcount) and result.rowcount != len(params):
            raise ConflictError(
                f"{len(params) - result.rowcount} of {len(params)} job(s) changed state concurrently "
                f"(expected {items[0].from_state.value}). To fix: re-read the jobs and retry"
            )
    conn.execute(_events.insert(), [_event(t, now) for t in transitions])


def transition(
    session: Session,
    job_id: str,
    to_state: JobState,
    *,
    now: datetime,
    reason: str = "",
    data: Mapping[str, Any] | None = None,
    expected: JobState | None = None,
    lock: bool = True,
    **fields: Any,
) -> JobState:
    """Move one job to ``to_state`` and return the state it left.

    ``expected`` (optional) is the state the caller believes the job is in; ``lock`` takes a row lock on
    PostgreSQL first. Raises :class:`NotFoundError` for an unknown job, :class:`ConflictError` when the
    transition is not allowed (or the job is not in ``expected``).
    """
    stmt = sa.select(_jobs.c.state).where(_jobs.c.id == job_id)
    if lock and session.connection().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    current = session.execute(stmt).scalar()
    if current is None:
        raise NotFoundError(f"job {job_id} not found")
    src = JobState(current)
    if expected is not None and src is not expected:
        raise ConflictError(f"job {job_id} is {src.value}, not {expected.value}. To fix: re-read the job")
    apply_transitions(
        session, [Transition(job_id, src, to_state, reason=reason, data=data, fields=fields)], now=now
    )
    return src


def note(session: Session, job_id: str, state: JobState, reason: str, *, now: datetime,
         data: Mapping[str, Any] | None = None) -> None:
    """Record an event without a state change (``from_state == to_state``), e.g. why a job is held."""
    session.connection().execute(
        _events.insert(), [_event(Transition(job_id, state, state, reason=reason, data=data), now)]
    )


def submit_jobs(
    session: Session,
    namespace: str,
    specs: Sequence[JobSpec],
    *,
    now: datetime,
    spec_docs: Sequence[str],
    priorities: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Insert ``specs`` as PENDING jobs of ``namespace`` with one submission event each, in the caller's
    transaction, and return their summaries (``id``, ``name``, ``namespace``, ``state``, ...) in order.

    ``spec_docs`` are the stored JSON documents of the specs (same order). ``priorities`` are the values to
    store (same order; the API passes :func:`broker.policy_store.resolve_priority` of each spec's
    ``priorityClassName``), else each spec's raw ``priority`` or 0. Three bulk statements in all.
    """
    rows: list[dict[str, Any]] = []
    labels: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    if priorities is not None and len(priorities) != len(specs):
        raise ValueError(f"{len(priorities)} priorities for {len(specs)} specs. To fix: pass one per spec")
    for i, (spec, doc) in enumerate(zip(specs, spec_docs, strict=True)):
        job_id = new_job_id()
        nodes = max(1, spec.request.nodes)
        rows.append(
            {
                "id": job_id,
                "namespace": namespace,
                "name": spec.name,
                "state": JobState.PENDING.value,
                "priority": int(priorities[i]) if priorities is not None else int(spec.priority or 0),
                "created_at": now,
                "updated_at": now,
                "vcpus": spec.request.vcpus * nodes,
                "memory_gib": spec.request.memory_gib * nodes,
                "gpus": spec.request.gpus * nodes,
                "spec_json": doc,
                "dry_run": False,
                "retries": 0,
            }
        )
        labels.extend({"job_id": job_id, "key": k, "value": v} for k, v in spec.labels.items())
        events.append(
            {"job_id": job_id, "at": now, "from_state": None, "to_state": JobState.PENDING.value,
             "reason": "submitted", "data_json": None}
        )
    conn = session.connection()
    conn.execute(_jobs.insert(), rows)
    if labels:
        conn.execute(_labels.insert(), labels)
    conn.execute(_events.insert(), events)
    return [
        {
            "id": r["id"],
            "name": r["name"],
            "namespace": namespace,
            "state": r["state"],
            "priority": r["priority"],
            "created_at": now.isoformat(),
            "labels": dict(spec.labels),
        }
        for r, spec in zip(rows, specs, strict=True)
    ]
