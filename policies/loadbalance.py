"""Load balancing across equivalent pools (on-prem racks, edge sites, regions offering the same thing).

Scoring plugins in the Kubernetes-scheduler shape: each has a ``NAME`` and ``score(pool, ctx) -> int`` in
0..100 (higher is better). :func:`choose_pool` sums the enabled plugins' scores times their weights from
config (e.g. ``{"least-loaded": 1, "performance": 2}``) and picks the best pool (ties: pool name).

* ``round-robin``: 100 for the pool after the last one chosen, falling off with distance in the cycle.
* ``least-loaded``: 100 x free fraction of the pool's slots.
* ``performance``: 100 x fastest mean runtime / this pool's mean runtime, from measured runtimes in the
  history (pools without history score 50).
* ``predictive``: 100 x best predicted completion / this pool's predicted completion, where predicted
  completion = queue wait (work ahead beyond free slots x predicted runtime / slots) + predicted runtime
  (exponentially weighted mean of measured runtimes, the history mean of all pools for a new pool).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import fmean
from typing import ClassVar, Protocol

__all__ = [
    "Pool",
    "Context",
    "Scorer",
    "RoundRobin",
    "LeastLoaded",
    "PerformanceWeighted",
    "Predictive",
    "SCORERS",
    "Choice",
    "choose_pool",
]


@dataclass(frozen=True, slots=True)
class Pool:
    """An equivalent pool: ``slots`` jobs can run at once, ``running`` now, ``queued`` waiting for it."""

    name: str
    slots: int
    running: int = 0
    queued: int = 0


@dataclass(frozen=True)
class Context:
    """What scorers may read: all ``pools``, measured ``runtimes_hours`` per pool (oldest first) and the
    ``last`` pool round robin chose."""

    pools: Sequence[Pool]
    runtimes_hours: Mapping[str, Sequence[float]] = field(default_factory=dict)
    last: str | None = None
    ewma_alpha: float = 0.3


class Scorer(Protocol):
    NAME: ClassVar[str]

    def score(self, pool: Pool, ctx: Context) -> int: ...


class RoundRobin:
    NAME: ClassVar[str] = "round-robin"

    def score(self, pool: Pool, ctx: Context) -> int:
        names = sorted(p.name for p in ctx.pools)
        n = len(names)
        start = (names.index(ctx.last) + 1) % n if ctx.last in names else 0
        dist = (names.index(pool.name) - start) % n
        return round(100 * (n - dist) / n)


class LeastLoaded:
    NAME: ClassVar[str] = "least-loaded"

    def score(self, pool: Pool, ctx: Context) -> int:
        if pool.slots <= 0:
            return 0
        return round(100 * max(0, pool.slots - pool.running - pool.queued) / pool.slots)


def _mean(values: Sequence[float]) -> float | None:
    return fmean(values) if values else None


def _ewma(values: Sequence[float], alpha: float) -> float | None:
    if not values:
        return None
    acc = values[0]
    for v in values[1:]:
        acc = alpha * v + (1 - alpha) * acc
    return acc


class PerformanceWeighted:
    NAME: ClassVar[str] = "performance"

    def score(self, pool: Pool, ctx: Context) -> int:
        means = {p.name: _mean(ctx.runtimes_hours.get(p.name, ())) for p in ctx.pools}
        known = [m for m in means.values() if m is not None and m > 0]
        mine = means.get(pool.name)
        if mine is None or mine <= 0 or not known:
            return 50
        return round(100 * min(known) / mine)


class Predictive:
    NAME: ClassVar[str] = "predictive"

    def predicted_hours(self, pool: Pool, ctx: Context) -> float:
        runtime = _ewma(ctx.runtimes_hours.get(pool.name, ()), ctx.ewma_alpha)
        if runtime is None:
            everything = [v for vs in ctx.runtimes_hours.values() for v in vs]
            runtime = _mean(everything) or 1.0
        if pool.slots <= 0:
            return float("inf")
        ahead = max(0, pool.running + pool.queued + 1 - pool.slots)
        return ahead * runtime / pool.slots + runtime

    def score(self, pool: Pool, ctx: Context) -> int:
        mine = self.predicted_hours(pool, ctx)
        best = min(self.predicted_hours(p, ctx) for p in ctx.pools)
        if mine == float("inf"):
            return 0
        return round(100 * best / mine) if mine > 0 else 100


SCORERS: Mapping[str, type[Scorer]] = {
    RoundRobin.NAME: RoundRobin,
    LeastLoaded.NAME: LeastLoaded,
    PerformanceWeighted.NAME: PerformanceWeighted,
    Predictive.NAME: Predictive,
}


@dataclass(frozen=True, slots=True)
class Choice:
    """The chosen ``pool`` and every pool's weighted total ``scores``."""

    pool: str
    scores: Mapping[str, float]


def choose_pool(ctx: Context, weights: Mapping[str, float]) -> Choice:
    """The best pool by the weighted sum of the enabled plugins (``weights`` by plugin name; unknown
    names raise ``ValueError`` listing the known ones). Pools with no slots are never chosen."""
    unknown = sorted(set(weights) - set(SCORERS))
    if unknown:
        raise ValueError(f"unknown load-balancing plugin(s) {unknown}. To fix: use {sorted(SCORERS)}")
    usable = [p for p in ctx.pools if p.slots > 0]
    if not usable:
        raise ValueError("no pool has any slots. To fix: add capacity")
    plugins = [(SCORERS[name](), w) for name, w in sorted(weights.items()) if w]
    totals = {p.name: float(sum(w * s.score(p, ctx) for s, w in plugins)) for p in usable}
    pool = min(totals, key=lambda name: (-totals[name], name))
    return Choice(pool, totals)
