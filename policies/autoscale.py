"""Pool autoscaling math, as the Kubernetes HPA computes it, plus the utilization band of a broker pool.

Per metric (:func:`metric_replicas`):

* ``utilization`` (average used/capacity over ready replicas, 0..1): nothing changes inside the band
  ``scale_in_utilization < u < scale_out_utilization`` (default 0.30 and 0.70); outside it
  ``desired = ceil(current * u / target)`` with ``target`` the band's midpoint unless set.
* ``average`` (e.g. queue length per replica): ``desired = ceil(total / target)`` -- HPA's AverageValue;
  unchanged while ``|ratio - 1| <= tolerance`` (0.1).
* ``value`` (e.g. oldest queue wait): ``desired = ceil(current * value / target)`` -- HPA's Value;
  the same tolerance.

Several metrics: the largest proposal wins (HPA). Then (:func:`decide`), in HPA's order:

1. stabilization: a scale-down takes the *highest* recommendation of the last
   ``scale_down_stabilization_seconds`` (default 300), a scale-up the *lowest* of the last
   ``scale_up_stabilization_seconds`` (default 0), so flapping metrics do not flap the pool;
2. rate limits (HPA's default behaviour): up by at most ``max(scale_up_max_pods, scale_up_max_percent %)``,
   down by at most ``scale_down_max_percent %`` of current per decision;
3. ``min_replicas``/``max_replicas``;
4. ``cooldown_seconds`` since the last change (a broker addition: cloud instances cost a billing minimum).

Pure functions of values; the recommendation history is passed in and returned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["ScalePolicy", "MetricValue", "Decision", "metric_replicas", "recommend", "decide"]

UTILIZATION, AVERAGE, VALUE = "utilization", "average", "value"


@dataclass(frozen=True)
class ScalePolicy:
    min_replicas: int = 0
    max_replicas: int = 10
    scale_out_utilization: float = 0.70
    scale_in_utilization: float = 0.30
    target_utilization: float | None = None  # None: the band's midpoint
    tolerance: float = 0.1
    scale_up_stabilization_seconds: float = 0.0
    scale_down_stabilization_seconds: float = 300.0
    scale_up_max_pods: int = 4
    scale_up_max_percent: float = 100.0
    scale_down_max_percent: float = 100.0
    cooldown_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 0 <= min_replicas ({self.min_replicas}) <= max_replicas ({self.max_replicas})")
        if not 0 < self.scale_in_utilization < self.scale_out_utilization <= 1.0:
            raise ValueError("need 0 < scale_in_utilization < scale_out_utilization <= 1")
        t = self.target
        if not self.scale_in_utilization <= t <= self.scale_out_utilization:
            raise ValueError(f"target_utilization {t} must lie within the band")

    @property
    def target(self) -> float:
        if self.target_utilization is not None:
            return self.target_utilization
        return (self.scale_in_utilization + self.scale_out_utilization) / 2


@dataclass(frozen=True)
class MetricValue:
    """One observed metric: ``kind`` utilization | average | value; ``value`` (for ``average``: the total
    over the pool, e.g. the queue length); ``target`` (ignored for utilization: the policy's)."""

    name: str
    kind: str
    value: float
    target: float = 0.0


@dataclass(frozen=True)
class Decision:
    desired: int
    raw: int  # the recommendation before stabilization, limits and bounds
    reason: str
    history: tuple[tuple[float, int], ...] = field(default=())


def metric_replicas(current: int, m: MetricValue, policy: ScalePolicy) -> tuple[int, str]:
    """The replicas one metric asks for, and why (see the module docstring)."""
    if m.kind == UTILIZATION:
        u = m.value
        if current == 0:
            return 0, f"{m.name}: no ready replicas"
        if policy.scale_in_utilization < u < policy.scale_out_utilization:
            band = f"{policy.scale_in_utilization:.0%}..{policy.scale_out_utilization:.0%}"
            return current, f"{m.name} {u:.0%} within {band}"
        want = math.ceil(current * u / policy.target - 1e-9)
        return want, f"{m.name} {u:.0%} vs target {policy.target:.0%}"
    if m.target <= 0:
        raise ValueError(f"metric {m.name}: target must be > 0")
    if m.kind == AVERAGE:
        if current == 0:
            return math.ceil(m.value / m.target - 1e-9), f"{m.name} {m.value:g} with no replicas"
        ratio = (m.value / current) / m.target
        if abs(ratio - 1.0) <= policy.tolerance:
            return current, f"{m.name} {m.value / current:.3g}/replica within tolerance of {m.target:g}"
        return math.ceil(m.value / m.target - 1e-9), f"{m.name} {m.value / current:.3g}/replica vs {m.target:g}"
    if m.kind == VALUE:
        ratio = m.value / m.target
        base = max(current, 1 if m.value > 0 else 0)
        if abs(ratio - 1.0) <= policy.tolerance:
            return current, f"{m.name} {m.value:g} within tolerance of {m.target:g}"
        return math.ceil(base * ratio - 1e-9), f"{m.name} {m.value:g} vs {m.target:g}"
    raise ValueError(f"metric {m.name}: unknown kind {m.kind!r} (utilization, average or value)")


def recommend(current: int, metrics: Sequence[MetricValue], policy: ScalePolicy) -> tuple[int, str]:
    """The largest proposal over ``metrics`` (HPA), with its reason; ``current`` without metrics."""
    best, why = current, "no metrics"
    for i, m in enumerate(metrics):
        n, reason = metric_replicas(current, m, policy)
        if i == 0 or n > best:
            best, why = n, reason
    return best, why


def decide(current: int, metrics: Sequence[MetricValue], policy: ScalePolicy, *, now_seconds: float,
           history: Sequence[tuple[float, int]] = (), last_scale_seconds: float | None = None,
           floor: int = 0) -> Decision:
    """The replicas to run now (see the module docstring). ``floor`` is a lower bound from elsewhere
    (a predictive forecast), applied before the bounds; ``history`` is the previous decisions' returned one."""
    raw, reason = recommend(current, metrics, policy)
    if floor > raw:
        raw, reason = floor, f"forecast needs {floor}"
    window = max(policy.scale_down_stabilization_seconds, policy.scale_up_stabilization_seconds)
    kept = tuple((t, n) for t, n in history if now_seconds - t < window) + ((now_seconds, raw),)
    desired = raw
    if raw < current:
        recent = [n for t, n in kept if now_seconds - t < policy.scale_down_stabilization_seconds] or [raw]
        desired = min(current, max(recent))
        if desired != raw:
            reason += f"; held at {desired} by the {policy.scale_down_stabilization_seconds:g}s down-stabilization"
    elif raw > current:
        recent = [n for t, n in kept if now_seconds - t < policy.scale_up_stabilization_seconds] or [raw]
        desired = max(current, min(recent))
    if desired > current:
        step = max(policy.scale_up_max_pods, math.ceil(current * policy.scale_up_max_percent / 100))
        if desired > current + step:
            desired = current + step
            reason += f"; up-rate limited to +{step}"
    elif desired < current:
        step = max(1, math.floor(current * policy.scale_down_max_percent / 100))
        desired = max(desired, current - step)
    bounded = min(policy.max_replicas, max(policy.min_replicas, desired))
    if bounded != desired:
        reason += f"; bounded to [{policy.min_replicas}, {policy.max_replicas}]"
    desired = bounded
    if (desired != current and last_scale_seconds is not None
            and now_seconds - last_scale_seconds < policy.cooldown_seconds
            and current >= policy.min_replicas):
        return Decision(current, raw, reason + f"; cooling down ({policy.cooldown_seconds:g}s)", kept)
    return Decision(desired, raw, reason, kept)
