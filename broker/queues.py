"""Queue disciplines per namespace and decayed fair-share usage, kept in the store.

The scheduler orders its pending jobs on two levels (like Kueue's ClusterQueue strategy within a cohort
that shares fairly):

1. **within a namespace** by the namespace's discipline (:data:`policies.queueing.DISCIPLINES` or
   ``default``): ``fifo`` (age), ``priority`` (priority, age), ``edf`` (deadline, priority, age) or
   ``fair-share`` (within one namespace every job has the same share, so: priority, age);
2. **across namespaces** by the cluster default discipline (row ``*``), applied to each namespace's next
   job (a k-way merge). With ``fair-share`` the namespace of lowest :class:`DominantShare` goes next;
   its share grows with each job taken (the job's requested resources x ``durationHours``), so one burst
   cannot starve the other namespaces within a cycle either.

``default`` is :func:`policies.queueing.queue_key` (priority, deadline, age, id), what the scheduler did
before disciplines existed. Every key ends in the job id, so the order is deterministic.

Fair share is fed by usage recorded when runs end (:func:`record_usage`, called by the scheduler in the
same transaction as the terminal transition, and at a preemption for the part that ran): one row per
namespace holding the usage decayed to its ``at`` time, so the half-life applies across restarts and
several broker processes see the same shares. Shares divide each namespace's decayed usage by the
cluster totals (all namespaces' decayed usage plus what the jobs being ordered ask for) and by the
namespace's weight (``weight`` 0: only leftovers).

Nothing here is kept only in memory: :func:`load_queue_config` and :func:`load_usage` read the store.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, Session, SQLModel

from broker.errors import SpecError
from broker.store import UTCDateTime, utc
from policies import queueing
from policies.queueing import DominantShare, FairShareUsage, UsageVector

__all__ = [
    "DEFAULT",
    "CLUSTER",
    "DEFAULT_HALF_LIFE_SECONDS",
    "QUEUE_DISCIPLINES",
    "QueueSettingRow",
    "FairShareUsageRow",
    "QueueConfig",
    "load_queue_config",
    "set_queue",
    "load_usage",
    "record_usage",
    "job_usage",
    "order_jobs",
    "queue_status",
]

DEFAULT = "default"  # policies.queueing.queue_key: priority, deadline, age, id
CLUSTER = "*"  # the row holding the cluster default discipline and the half-life
DEFAULT_HALF_LIFE_SECONDS = 7 * 24 * 3600.0
QUEUE_DISCIPLINES = (DEFAULT, *queueing.DISCIPLINES)


class QueueSettingRow(SQLModel, table=True):
    """The queue setting of one namespace (``name``), or of the cluster (``name == "*"``).

    ``discipline``: one of :data:`QUEUE_DISCIPLINES`; ``weight``: the namespace's fair-share weight
    (>= 0); ``half_life_seconds``: the decay of fair-share usage (read from the ``*`` row only)."""

    __tablename__ = "queue_settings"
    name: str = Field(sa_column=sa.Column(sa.String(63), primary_key=True))
    discipline: str = Field(default=DEFAULT, sa_column=sa.Column(sa.String(16), nullable=False))
    weight: float = Field(default=1.0, sa_column=sa.Column(sa.Float, nullable=False))
    half_life_seconds: float | None = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    updated_at: datetime = Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=False))


class FairShareUsageRow(SQLModel, table=True):
    """Usage of one namespace decayed to ``at``: resource-hours and dollars of its ended runs."""

    __tablename__ = "fair_share_usage"
    namespace: str = Field(sa_column=sa.Column(sa.String(63), primary_key=True))
    cpu_hours: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False))
    memory_gib_hours: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False))
    gpu_hours: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False))
    usd: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False))
    at: datetime = Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=False))


_settings = QueueSettingRow.__table__  # type: ignore[attr-defined]
_usage = FairShareUsageRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class QueueConfig:
    """The queue settings of every namespace, as of one read. Namespaces without a row use
    ``default_discipline`` within themselves and weight 1."""

    default_discipline: str = DEFAULT
    half_life_seconds: float = DEFAULT_HALF_LIFE_SECONDS
    disciplines: Mapping[str, str] = field(default_factory=dict)
    weights: Mapping[str, float] = field(default_factory=dict)

    def discipline_of(self, namespace: str) -> str:
        return self.disciplines.get(namespace, self.default_discipline)

    @property
    def uses_fair_share(self) -> bool:
        return self.default_discipline == queueing.FAIR_SHARE


def load_queue_config(session: Session) -> QueueConfig:
    """Every queue setting (one small query)."""
    default, half_life = DEFAULT, DEFAULT_HALF_LIFE_SECONDS
    disciplines: dict[str, str] = {}
    weights: dict[str, float] = {}
    for r in session.execute(sa.select(_settings)):
        if r.name == CLUSTER:
            default = r.discipline
            if r.half_life_seconds is not None:
                half_life = float(r.half_life_seconds)
        else:
            disciplines[r.name] = r.discipline
            weights[r.name] = float(r.weight)
    return QueueConfig(default, half_life, disciplines, weights)


def _check_discipline(discipline: str) -> str:
    if discipline not in QUEUE_DISCIPLINES:
        raise SpecError("discipline", f"{discipline!r} is not a queue discipline. To fix: use one of "
                        f"{', '.join(QUEUE_DISCIPLINES)}")
    return discipline


def set_queue(
    session: Session,
    name: str,
    *,
    now: datetime,
    discipline: str | None = None,
    weight: float | None = None,
    half_life_seconds: float | None = None,
) -> QueueSettingRow:
    """Create or change the queue setting ``name`` (a namespace, or :data:`CLUSTER`); arguments left
    ``None`` keep their value. Raises :class:`SpecError` for an unknown discipline, a negative or
    non-finite weight or half-life, or a half-life on a namespace (it is a cluster setting). No commit."""
    if discipline is not None:
        _check_discipline(discipline)
    if weight is not None and (not math.isfinite(weight) or weight < 0):
        raise SpecError("weight", f"{weight} is not a weight. To fix: use a number >= 0 (0 = only leftovers)")
    if half_life_seconds is not None:
        if name != CLUSTER:
            raise SpecError("halfLifeSeconds", "the half-life is a cluster setting. To fix: PUT /v1/queue")
        if half_life_seconds < 0 or math.isnan(half_life_seconds):
            raise SpecError("halfLifeSeconds", f"{half_life_seconds} is negative. To fix: use seconds >= 0")
    row = session.get(QueueSettingRow, name)
    if row is None:
        row = QueueSettingRow(name=name, discipline=DEFAULT, weight=1.0, updated_at=now)
    if discipline is not None:
        row.discipline = discipline
    if weight is not None:
        row.weight = float(weight)
    if half_life_seconds is not None:
        row.half_life_seconds = float(half_life_seconds)
    row.updated_at = now
    session.add(row)
    session.flush()
    return row


def load_usage(session: Session, half_life_seconds: float) -> FairShareUsage:
    """The stored fair-share usage of every namespace (each decayed from its own ``at``)."""
    entries = {
        r.namespace: (UsageVector(r.cpu_hours, r.memory_gib_hours, r.gpu_hours, r.usd), utc(r.at))
        for r in session.execute(sa.select(_usage))
    }
    return FairShareUsage(half_life_seconds, entries)


def record_usage(
    session: Session, usage: Mapping[str, UsageVector], now: datetime, half_life_seconds: float
) -> None:
    """Add ``usage`` (namespace -> resource-hours and dollars of runs that just ended) to the stored
    usage, decaying what was there to ``now`` first. In the caller's transaction (no commit)."""
    if not usage:
        return
    conn = session.connection()
    stmt = sa.select(_usage).where(_usage.c.namespace.in_(list(usage)))
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    current = {r.namespace: r for r in conn.execute(stmt)}
    decayer = FairShareUsage(half_life_seconds)
    for ns, add in usage.items():
        row = current.get(ns)
        if row is None:
            conn.execute(_usage.insert(), [{"namespace": ns, "cpu_hours": add.cpu_hours,
                                            "memory_gib_hours": add.memory_gib_hours, "gpu_hours": add.gpu_hours,
                                            "usd": add.usd, "at": now}])
            continue
        old = UsageVector(row.cpu_hours, row.memory_gib_hours, row.gpu_hours, row.usd)
        decayed = decayer.add(ns, old, utc(row.at)).usage(ns, now) + add
        conn.execute(_usage.update().where(_usage.c.namespace == ns).values(
            cpu_hours=decayed.cpu_hours, memory_gib_hours=decayed.memory_gib_hours, gpu_hours=decayed.gpu_hours,
            usd=decayed.usd, at=now))


def job_usage(vcpus: float, memory_gib: float, gpus: float, hours: float, usd: float = 0.0) -> UsageVector:
    """The usage of a run of ``hours`` holding these resources (all nodes) and costing ``usd``."""
    h = max(0.0, hours)
    return UsageVector(vcpus * h, memory_gib * h, gpus * h, max(0.0, usd))


def _expected_usage(job: Any) -> UsageVector:
    req = job.request
    nodes = max(1, req.nodes)
    return job_usage(req.vcpus * nodes, req.memory_gib * nodes, req.gpus * nodes, req.duration_hours)


def _within_key(discipline: str) -> Callable[[Any], Any]:
    if discipline == DEFAULT:
        return queueing.queue_key
    if discipline == queueing.FAIR_SHARE:
        return queueing.priority_key  # one namespace: every job has the same share
    return queueing.key_for(discipline)


def _totals(usage: FairShareUsage, jobs: Sequence[Any], now: datetime) -> UsageVector:
    total = UsageVector()
    for ns in usage.entries:
        total = total + usage.usage(ns, now)
    for job in jobs:
        total = total + _expected_usage(job)
    return total


def order_jobs(jobs: Sequence[Any], config: QueueConfig, usage: FairShareUsage | None, now: datetime) -> list[Any]:
    """``jobs`` (each with ``id``, ``namespace``, ``priority``, ``created_at``, ``deadline``, ``request``)
    in the order the scheduler tries them (see the module docstring). ``usage`` is needed only when the
    cluster discipline is ``fair-share`` (``None`` then counts as no usage)."""
    groups: dict[str, list[Any]] = {}
    for job in jobs:
        groups.setdefault(job.namespace, []).append(job)
    for ns, items in groups.items():
        items.sort(key=_within_key(config.discipline_of(ns)))
    if len(groups) == 1:
        return next(iter(groups.values()))
    out: list[Any] = []
    if config.uses_fair_share:
        work = usage or FairShareUsage(config.half_life_seconds)
        totals = _totals(work, jobs, now)

        def share(ns: str) -> DominantShare:
            return queueing.dominant_share(work.usage(ns, now), totals, config.weights.get(ns, 1.0))

        heap: list[tuple[Any, ...]] = []
        for ns, items in groups.items():
            heapq.heappush(heap, (share(ns), *queueing.priority_key(items[0]), ns, 0))
        while heap:
            *_, ns, i = heapq.heappop(heap)
            job = groups[ns][i]
            out.append(job)
            work = work.add(ns, _expected_usage(job), now)
            if i + 1 < len(groups[ns]):
                heapq.heappush(heap, (share(ns), *queueing.priority_key(groups[ns][i + 1]), ns, i + 1))
        return out
    across = _within_key(config.default_discipline)
    merged = heapq.merge(*groups.values(), key=across)
    return list(merged)


def queue_status(session: Session, namespace: str, now: datetime) -> dict[str, Any]:
    """The queue of ``namespace`` as the API shows it: its discipline (and whether it is set), weight,
    the cluster discipline and half-life, its decayed usage and dominant share among all namespaces."""
    config = load_queue_config(session)
    usage = load_usage(session, config.half_life_seconds)
    totals = _totals(usage, (), now)
    mine = usage.usage(namespace, now)
    share = queueing.dominant_share(mine, totals, config.weights.get(namespace, 1.0))
    return {
        "namespace": namespace,
        "discipline": config.discipline_of(namespace),
        "configured": namespace in config.disciplines,
        "weight": config.weights.get(namespace, 1.0),
        "cluster": {"discipline": config.default_discipline, "halfLifeSeconds": config.half_life_seconds},
        "usage": {"cpu_hours": mine.cpu_hours, "memory_gib_hours": mine.memory_gib_hours,
                  "gpu_hours": mine.gpu_hours, "usd": mine.usd},
        "dominantShare": {"share": share.share, "weighted": None if math.isinf(share.weighted) else share.weighted,
                          "resource": share.resource},
    }
