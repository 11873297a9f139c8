"""Queue orderings: strict FIFO, priority, fair share (dominant resource fairness) and earliest deadline
first. Each discipline is one key function; sorting pending work by it gives the order the scheduler
tries jobs in. Every key ends in the job id, so equal keys never depend on input order.

=============  ==========================================================================================
discipline     key (ascending = first)
=============  ==========================================================================================
``fifo``       1. older ``created_at``  2. id
``priority``   1. higher priority  2. older  3. id
``fair-share`` 1. lower :class:`DominantShare` of the job's namespace  2. higher priority  3. older  4. id
``edf``        1. earlier deadline (none = last)  2. higher priority  3. older  4. id
=============  ==========================================================================================

Fair share follows Kueue's ``CompareDRS``: a namespace's dominant share is the largest of its
(decayed) usage fractions of the cluster totals over vCPU, memory, GPU and dollars, divided by its weight.
A weight of 0 means "only when nobody else waits": such namespaces sort after every positive weight,
among themselves by raw share. Usage decays with a half-life (:class:`FairShareUsage`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import total_ordering
from typing import Any

__all__ = [
    "FIFO",
    "PRIORITY",
    "FAIR_SHARE",
    "EDF",
    "DISCIPLINES",
    "UsageVector",
    "DominantShare",
    "FairShareUsage",
    "dominant_share",
    "fifo_key",
    "priority_key",
    "edf_key",
    "fair_share_key",
    "queue_key",
    "key_for",
    "order",
]

FIFO = "fifo"
PRIORITY = "priority"
FAIR_SHARE = "fair-share"
EDF = "edf"
DISCIPLINES = (FIFO, PRIORITY, FAIR_SHARE, EDF)

_FAR_FUTURE = math.inf


def _ts(value: datetime | None) -> float:
    return _FAR_FUTURE if value is None else value.timestamp()


def _attr(job: Any, name: str, default: Any = None) -> Any:
    if isinstance(job, Mapping):
        return job.get(name, default)
    return getattr(job, name, default)


def _priority(job: Any) -> int:
    return int(_attr(job, "priority", 0) or 0)


def _id(job: Any) -> str:
    return str(_attr(job, "id", ""))


def fifo_key(job: Any) -> tuple[float, str]:
    """1. older ``created_at`` 2. id."""
    return (_ts(_attr(job, "created_at")), _id(job))


def priority_key(job: Any) -> tuple[int, float, str]:
    """1. higher ``priority`` 2. older ``created_at`` 3. id."""
    return (-_priority(job), _ts(_attr(job, "created_at")), _id(job))


def edf_key(job: Any) -> tuple[float, int, float, str]:
    """1. earlier ``deadline`` (jobs without one last) 2. higher priority 3. older 4. id."""
    return (_ts(_attr(job, "deadline")), -_priority(job), _ts(_attr(job, "created_at")), _id(job))


def queue_key(job: Any) -> tuple[int, float, float, str]:
    """The scheduler's default order when a queue names no discipline:
    1. higher priority  2. earlier deadline  3. older ``created_at``  4. id.

    ``job`` is anything with ``priority``, ``deadline``, ``created_at`` and ``id`` attributes (or a mapping
    with those keys): a :class:`policies.workload.Workload`, a store row... Missing priority is 0, a
    missing deadline sorts last.
    """
    return (-_priority(job), _ts(_attr(job, "deadline")), _ts(_attr(job, "created_at")), _id(job))


@dataclass(frozen=True, slots=True)
class UsageVector:
    """Consumption measured in resource-hours and dollars: ``cpu_hours``, ``memory_gib_hours``,
    ``gpu_hours``, ``usd``."""

    cpu_hours: float = 0.0
    memory_gib_hours: float = 0.0
    gpu_hours: float = 0.0
    usd: float = 0.0

    def __add__(self, other: UsageVector) -> UsageVector:
        return UsageVector(
            self.cpu_hours + other.cpu_hours,
            self.memory_gib_hours + other.memory_gib_hours,
            self.gpu_hours + other.gpu_hours,
            self.usd + other.usd,
        )

    def scale(self, factor: float) -> UsageVector:
        return UsageVector(
            self.cpu_hours * factor, self.memory_gib_hours * factor, self.gpu_hours * factor, self.usd * factor
        )

    def as_tuple(self) -> tuple[float, float, float, float]:
        return (self.cpu_hours, self.memory_gib_hours, self.gpu_hours, self.usd)


@total_ordering
@dataclass(frozen=True, slots=True)
class DominantShare:
    """A comparable fair-share value: smaller is served first.

    ``zero_weight`` namespaces compare after every weighted one (they get only leftovers); then
    ``weighted`` (share / weight) compares, then the raw ``share``. ``resource`` names the dominant
    resource, for explanations only.
    """

    weighted: float
    share: float
    zero_weight: bool = False
    resource: str = ""

    def _key(self) -> tuple[bool, float, float]:
        return (self.zero_weight, self.weighted, self.share)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, DominantShare):
            return NotImplemented
        return self._key() < other._key()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DominantShare):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


_RESOURCE_NAMES = ("cpu", "memory", "gpu", "usd")


def dominant_share(usage: UsageVector, totals: UsageVector, weight: float) -> DominantShare:
    """DRF share of ``usage`` against the cluster ``totals`` (resources with a zero total are ignored),
    divided by ``weight``. Negative weights are an error (``ValueError``)."""
    if weight < 0:
        raise ValueError(f"fair-share weight {weight} is negative. To fix: use a weight >= 0")
    best, best_name = 0.0, ""
    for name, used, total in zip(_RESOURCE_NAMES, usage.as_tuple(), totals.as_tuple(), strict=True):
        if total > 0 and used / total > best:
            best, best_name = used / total, name
    if weight == 0:
        return DominantShare(weighted=math.inf if best > 0 else 0.0, share=best, zero_weight=True,
                             resource=best_name)
    return DominantShare(weighted=best / weight, share=best, resource=best_name)


@dataclass(frozen=True)
class FairShareUsage:
    """Per-namespace usage that decays exponentially with ``half_life_seconds`` (``0`` = no memory: only
    what is added at the same instant counts; ``math.inf`` = never decays). Immutable: :meth:`add`
    returns a new value, so a scheduling cycle can work on a copy."""

    half_life_seconds: float = 7 * 24 * 3600.0
    entries: Mapping[str, tuple[UsageVector, datetime]] = field(default_factory=dict)

    def _decay(self, elapsed_seconds: float) -> float:
        if elapsed_seconds <= 0:
            return 1.0
        if self.half_life_seconds == 0:
            return 0.0
        if math.isinf(self.half_life_seconds):
            return 1.0
        return float(0.5 ** (elapsed_seconds / self.half_life_seconds))

    def usage(self, namespace: str, now: datetime) -> UsageVector:
        """Decayed usage of ``namespace`` at ``now`` (zero when never seen)."""
        entry = self.entries.get(namespace)
        if entry is None:
            return UsageVector()
        vec, at = entry
        return vec.scale(self._decay((now - at).total_seconds()))

    def add(self, namespace: str, usage: UsageVector, now: datetime) -> FairShareUsage:
        """A copy with ``usage`` added to ``namespace`` at ``now`` (older usage decayed first)."""
        entries = dict(self.entries)
        entries[namespace] = (self.usage(namespace, now) + usage, now)
        return FairShareUsage(self.half_life_seconds, entries)

    def shares(
        self, totals: UsageVector, weights: Mapping[str, float], now: datetime, *, default_weight: float = 1.0
    ) -> dict[str, DominantShare]:
        """The :class:`DominantShare` of every namespace that has usage or a weight."""
        names = set(self.entries) | set(weights)
        return {
            ns: dominant_share(self.usage(ns, now), totals, weights.get(ns, default_weight)) for ns in names
        }


def fair_share_key(
    job: Any, shares: Mapping[str, DominantShare]
) -> tuple[DominantShare, int, float, str]:
    """1. lower dominant share of the job's ``namespace`` (absent = 0) 2. higher priority 3. older 4. id."""
    share = shares.get(str(_attr(job, "namespace", "")), DominantShare(0.0, 0.0))
    return (share, -_priority(job), _ts(_attr(job, "created_at")), _id(job))


def key_for(discipline: str, *, shares: Mapping[str, DominantShare] | None = None) -> Callable[[Any], Any]:
    """The key function of ``discipline`` (one of :data:`DISCIPLINES`). ``fair-share`` needs ``shares``.
    Raises ``ValueError`` for an unknown name."""
    if discipline == FIFO:
        return fifo_key
    if discipline == PRIORITY:
        return priority_key
    if discipline == EDF:
        return edf_key
    if discipline == FAIR_SHARE:
        fixed = dict(shares or {})
        return lambda job: fair_share_key(job, fixed)
    raise ValueError(f"unknown queue discipline {discipline!r}. To fix: use one of {', '.join(DISCIPLINES)}")


def order(jobs: Iterable[Any], discipline: str, *, shares: Mapping[str, DominantShare] | None = None) -> list[Any]:
    """``jobs`` sorted by ``discipline`` (stable, and total thanks to the id tie-break)."""
    return sorted(jobs, key=key_for(discipline, shares=shares))

