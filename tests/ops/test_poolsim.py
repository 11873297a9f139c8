"""Elastic pools in simulated time (issue 14 acceptance): a load curve scales out when utilization reaches
70 % and in at 30 %; on a daily-cycle trace the predictive (Holt-Winters) pool misses fewer deadlines than
the reactive one at equal or lower cost."""

from __future__ import annotations

import numpy as np

from broker.ops.forecast import ArrivalForecaster, holt_winters_forecast
from broker.ops.poolsim import PoolConfig, daily_trace, simulate_pool
from policies.autoscale import ScalePolicy


def test_a_load_curve_scales_out_at_70_and_in_at_30_percent() -> None:
    # 1 job/min of 40 min on 4-slot instances; the load then drops to 1 job every 10 min
    arrivals = np.concatenate([np.arange(0, 4 * 3600, 60.0), np.arange(4 * 3600, 10 * 3600, 600.0)])
    cfg = PoolConfig(policy=ScalePolicy(min_replicas=1, max_replicas=40), service_seconds=2400, boot_seconds=300,
                     deadline_seconds=10**6, queue_per_replica=None)
    res = simulate_pool(arrivals, cfg, until_seconds=10 * 3600)
    assert res.scale_events, "the pool never scaled"
    util = {t: u for t, _, _, u in res.timeline}
    for t, before, after, reason in res.scale_events:
        u = util[t]
        if after > before:
            assert u >= 0.70, (t, u, reason)
        else:
            assert u <= 0.30, (t, u, reason)
    ups = [e for e in res.scale_events if e[2] > e[1]]
    downs = [e for e in res.scale_events if e[2] < e[1]]
    assert ups and downs and max(e[0] for e in ups) < 4 * 3600 + 3600 < min(e[0] for e in downs) + 3600
    peak = max(n for _, n, _, _ in res.timeline)
    assert 8 <= peak <= 24  # 40 busy slots at steady state: 10 instances at 100 %, 20 at the 50 % target


def test_the_predictive_pool_beats_the_reactive_one_on_a_daily_cycle() -> None:
    days = 4
    trace = daily_trace(days, seed=3)
    measured = 2 * 86400.0  # the forecaster needs two days of history; days 3 and 4 are compared
    base = PoolConfig(deadline_seconds=1500)
    reactive = simulate_pool(trace, base, measure_from_seconds=measured)
    predictive = simulate_pool(trace, PoolConfig(deadline_seconds=1500, predictive=True),
                               measure_from_seconds=measured)
    assert reactive.jobs == predictive.jobs > 3000
    assert reactive.deadline_misses > 0
    assert predictive.deadline_misses < reactive.deadline_misses / 4
    assert predictive.cost_usd <= reactive.cost_usd
    # provisioned ahead: before 08:00 on a measured day the predictive pool is already growing
    def size_at(res, t):  # type: ignore[no-untyped-def]
        return next(n for ts, n, _, _ in res.timeline if ts >= t)

    assert size_at(predictive, 3 * 86400 + 8 * 3600) > 2 * size_at(reactive, 3 * 86400 + 8 * 3600)


def test_holt_winters_learns_a_daily_shape() -> None:
    season = 48
    rng = np.random.default_rng(0)
    shape = np.where((np.arange(season) >= 16) & (np.arange(season) < 34), 120.0, 10.0)
    y = np.tile(shape, 4) + rng.normal(0, 3, 4 * season)
    f = holt_winters_forecast(y, season, season)
    assert np.abs(f - shape).mean() < 10
    fc = ArrivalForecaster(bucket_seconds=1800, min_seasons=2)
    for b in range(2 * season):
        fc.observe(b * 1800.0 + 1, int(shape[b % season]))
    assert fc.rate(1.0, 1.0) is None  # not enough history yet
    rate = fc.rate(2 * 86400 + 17 * 1800 + 5, 2 * 86400.0)
    assert rate is not None and abs(rate * 1800 - 120) < 15
