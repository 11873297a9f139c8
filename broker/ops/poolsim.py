"""A pool simulator in simulated time: arrivals from a trace, instances that take ``boot_seconds`` to be
ready and run ``slots`` jobs each, and an autoscaler deciding every ``tick_seconds`` with the same
:func:`policies.autoscale.decide` the broker's pools use -- reactively, or with a Holt-Winters floor
(:class:`broker.ops.forecast.ArrivalForecaster`) that provisions ahead of the forecast peak.

Scale-in never kills a running job: booting instances go first, then idle ready ones (a drain). Cost is
instance time from launch to termination at ``hourly_usd``. A job misses its deadline when it finishes
after ``arrival + deadline_seconds``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from broker.ops.forecast import ArrivalForecaster, replicas_for_rate
from policies.autoscale import MetricValue, ScalePolicy, decide

__all__ = ["PoolConfig", "SimResult", "simulate_pool", "daily_trace", "load_curve"]


@dataclass(frozen=True)
class PoolConfig:
    policy: ScalePolicy = field(default_factory=lambda: ScalePolicy(min_replicas=1, max_replicas=200))
    slots: int = 4
    boot_seconds: float = 600.0
    hourly_usd: float = 0.40
    service_seconds: float = 1200.0
    deadline_seconds: float = 1800.0
    tick_seconds: float = 60.0
    queue_per_replica: float | None = 2.0  # the custom metric "queue length per replica" (None: off)
    predictive: bool = False
    forecast_target_utilization: float = 0.7
    lead_seconds: float = 900.0  # look this far past the boot time


@dataclass
class SimResult:
    jobs: int = 0
    finished: int = 0
    deadline_misses: int = 0
    cost_usd: float = 0.0
    mean_wait_seconds: float = 0.0
    p95_wait_seconds: float = 0.0
    instance_hours: float = 0.0
    timeline: list[tuple[float, int, int, float]] = field(default_factory=list)  # (t, desired, ready, util)
    scale_events: list[tuple[float, int, int, str]] = field(default_factory=list)  # (t, from, to, reason)

    def summary(self) -> dict[str, float]:
        return {"jobs": self.jobs, "deadline_misses": self.deadline_misses, "cost_usd": round(self.cost_usd, 2),
                "mean_wait_s": round(self.mean_wait_seconds, 1), "p95_wait_s": round(self.p95_wait_seconds, 1),
                "instance_hours": round(self.instance_hours, 1)}


def load_curve(t_seconds: float, base_per_hour: float, peak_per_hour: float, ramp_hours: float = 0.25) -> float:
    """Arrivals per hour of a working day: base at night, a steep ramp from 08:00 over ``ramp_hours``, peak
    until 17:00, down over ``ramp_hours`` (the same every day)."""
    h = (t_seconds % 86400.0) / 3600.0
    up, down = 8.0, 17.0
    if up + ramp_hours <= h < down:
        f = 1.0
    elif up <= h < up + ramp_hours:
        f = (h - up) / ramp_hours
    elif down <= h < down + ramp_hours:
        f = 1.0 - (h - down) / ramp_hours
    else:
        f = 0.0
    return base_per_hour + (peak_per_hour - base_per_hour) * f


def daily_trace(days: int, *, base_per_hour: float = 20.0, peak_per_hour: float = 240.0, seed: int = 0
                ) -> np.ndarray:
    """Arrival times (seconds, ascending) of a non-homogeneous Poisson process following :func:`load_curve`
    (by thinning)."""
    rng = np.random.default_rng(seed)
    horizon = days * 86400.0
    lam_max = max(base_per_hour, peak_per_hour) / 3600.0
    n = rng.poisson(lam_max * horizon)
    t = np.sort(rng.uniform(0.0, horizon, n))
    rate = np.array([load_curve(x, base_per_hour, peak_per_hour) for x in t]) / 3600.0
    keep = rng.uniform(0.0, 1.0, n) < rate / lam_max
    return t[keep]


@dataclass
class _Instance:
    launched: float
    ready_at: float
    busy: int = 0


def simulate_pool(arrivals: Sequence[float], config: PoolConfig, *, until_seconds: float | None = None,
                  measure_from_seconds: float = 0.0, initial_replicas: int | None = None) -> SimResult:
    """Run the pool over ``arrivals`` (seconds); jobs arriving before ``measure_from_seconds`` warm up the
    pool and the forecaster but are not counted."""
    arr = np.asarray(arrivals, dtype=float)
    end = until_seconds if until_seconds is not None else (float(arr[-1]) + 3 * config.deadline_seconds if arr.size
                                                            else 0.0)
    p = config.policy
    n0 = initial_replicas if initial_replicas is not None else max(1, p.min_replicas)
    insts: list[_Instance] = [_Instance(0.0, 0.0) for _ in range(n0)]
    queue: deque[float] = deque()
    running: list[tuple[float, int, float]] = []  # heap of (finish time, instance index id, arrival)
    by_id: dict[int, _Instance] = {}
    for inst in insts:
        by_id[id(inst)] = inst
    forecaster = ArrivalForecaster() if config.predictive else None
    res = SimResult()
    waits: list[float] = []
    history: tuple[tuple[float, int], ...] = ()
    last_scale: float | None = None
    cost_seconds = 0.0
    i = 0
    t = 0.0
    while t <= end:
        # finish jobs
        while running and running[0][0] <= t:
            fin, iid, arrived = heapq.heappop(running)
            by_id[iid].busy -= 1
            if arrived >= measure_from_seconds:
                res.finished += 1
                if fin > arrived + config.deadline_seconds:
                    res.deadline_misses += 1
        # arrivals up to t
        while i < arr.size and arr[i] <= t:
            queue.append(float(arr[i]))
            if forecaster is not None:
                forecaster.observe(float(arr[i]))
            if arr[i] >= measure_from_seconds:
                res.jobs += 1
            i += 1
        # start queued jobs on ready slots (FIFO)
        for inst in insts:
            while queue and inst.ready_at <= t and inst.busy < config.slots:
                arrived = queue.popleft()
                inst.busy += 1
                heapq.heappush(running, (t + config.service_seconds, id(inst), arrived))
                if arrived >= measure_from_seconds:
                    waits.append(t - arrived)
        # autoscale
        ready = [x for x in insts if x.ready_at <= t]
        slots = len(insts) * config.slots
        # As the HPA does for pods not yet ready: a booting instance counts as 0% busy, else every tick of
        # its boot would scale out again on the same load.
        util = (sum(x.busy for x in ready) / slots) if slots else 0.0
        metrics = [MetricValue("utilization", "utilization", util)] if insts else []
        if config.queue_per_replica is not None:
            metrics.append(MetricValue("queue", "average", float(len(queue)), config.queue_per_replica))
        floor = 0
        if forecaster is not None:
            ahead = t + config.boot_seconds + config.lead_seconds
            rates = [forecaster.rate(x, t) for x in (t + config.boot_seconds, ahead)]
            known = [r for r in rates if r is not None]
            if known:
                floor = replicas_for_rate(max(known), config.service_seconds, config.slots,
                                          config.forecast_target_utilization)
        current = len(insts)
        d = decide(current, metrics, p, now_seconds=t, history=history, last_scale_seconds=last_scale, floor=floor)
        history = d.history
        if d.desired > current:
            for _ in range(d.desired - current):
                inst = _Instance(t, t + config.boot_seconds)
                insts.append(inst)
                by_id[id(inst)] = inst
        elif d.desired < current:
            remove = current - d.desired
            order = sorted((x for x in insts if x.busy == 0), key=lambda x: (x.ready_at <= t, -x.launched))
            for inst in order[:remove]:
                insts.remove(inst)
                if t >= measure_from_seconds:
                    cost_seconds += t - max(inst.launched, measure_from_seconds)
        if len(insts) != current:
            last_scale = t
            if t >= measure_from_seconds:
                res.scale_events.append((t, current, len(insts), d.reason))
        if t >= measure_from_seconds:
            res.timeline.append((t, len(insts), len(ready), util))
        t += config.tick_seconds
    for inst in insts:
        cost_seconds += max(0.0, end - max(inst.launched, measure_from_seconds))
    res.instance_hours = cost_seconds / 3600.0
    res.cost_usd = res.instance_hours * config.hourly_usd
    res.deadline_misses += sum(1 for _, _, a in running if a >= measure_from_seconds) + sum(
        1 for a in queue if a >= measure_from_seconds)
    if waits:
        res.mean_wait_seconds = float(np.mean(waits))
        res.p95_wait_seconds = float(np.percentile(waits, 95))
    return res


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)
