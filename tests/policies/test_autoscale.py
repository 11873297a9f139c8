"""The HPA math of broker pools: the 70 % / 30 % band, the formula, tolerance, stabilization, rate limits,
bounds and cooldown."""

from __future__ import annotations

import pytest

from policies.autoscale import MetricValue, ScalePolicy, decide, metric_replicas, recommend

P = ScalePolicy(min_replicas=1, max_replicas=50)


def _util(u: float) -> MetricValue:
    return MetricValue("cpu", "utilization", u)


@pytest.mark.parametrize("u,want", [(0.69, 10), (0.70, 14), (0.95, 19), (0.31, 10), (0.30, 6), (0.05, 1)])
def test_scale_out_at_70_and_in_at_30_by_the_hpa_formula(u: float, want: int) -> None:
    assert decide(10, [_util(u)], P, now_seconds=0).desired == want


def test_thresholds_and_target_are_configurable() -> None:
    p = ScalePolicy(max_replicas=50, scale_out_utilization=0.8, scale_in_utilization=0.4, target_utilization=0.6)
    assert metric_replicas(10, _util(0.75), p)[0] == 10
    assert metric_replicas(10, _util(0.9), p)[0] == 15  # ceil(10 * 0.9 / 0.6)
    with pytest.raises(ValueError):
        ScalePolicy(scale_out_utilization=0.3, scale_in_utilization=0.7)


def test_custom_metrics_queue_length_per_replica_and_queue_wait() -> None:
    assert metric_replicas(4, MetricValue("queue", "average", 40, target=5), P)[0] == 8  # ceil(40 / 5)
    assert metric_replicas(4, MetricValue("queue", "average", 21, target=5), P)[0] == 4  # within 10 % tolerance
    assert metric_replicas(0, MetricValue("queue", "average", 11, target=5), P)[0] == 3  # from zero
    assert metric_replicas(4, MetricValue("wait", "value", 600, target=120), P)[0] == 20
    # several metrics: the largest proposal wins
    n, why = recommend(4, [_util(0.5), MetricValue("queue", "average", 40, target=5)], P)
    assert n == 8 and "queue" in why


def test_scale_down_waits_for_the_stabilization_window() -> None:
    history: tuple[tuple[float, int], ...] = ()
    d = decide(10, [_util(0.9)], P, now_seconds=0, history=history)  # recommendation 18
    assert d.desired == 18
    d = decide(18, [_util(0.1)], P, now_seconds=60, history=d.history)
    assert d.desired == 18 and "down-stabilization" in d.reason  # 300 s window still holds the 18
    d = decide(18, [_util(0.1)], P, now_seconds=301, history=d.history)
    assert d.desired == 4  # ceil(18 * 0.1 / 0.5)


def test_rate_limits_bounds_and_cooldown() -> None:
    d = decide(2, [_util(1.0)], ScalePolicy(max_replicas=100, scale_up_max_pods=4, scale_up_max_percent=100),
               now_seconds=0)
    assert d.desired == 4 and d.raw == 4
    d = decide(2, [MetricValue("q", "average", 100, target=1)], ScalePolicy(max_replicas=100), now_seconds=0)
    assert d.desired == 6 and "up-rate limited" in d.reason  # +max(4 pods, 100 %)
    assert decide(40, [_util(1.0)], P, now_seconds=0).desired == 50  # max_replicas
    assert decide(3, [_util(0.0)], ScalePolicy(min_replicas=2, scale_down_stabilization_seconds=0),
                  now_seconds=0).desired == 2
    cool = ScalePolicy(max_replicas=50, cooldown_seconds=120)
    d = decide(10, [_util(0.9)], cool, now_seconds=100, last_scale_seconds=50)
    assert d.desired == 10 and "cooling down" in d.reason
    assert decide(10, [_util(0.9)], cool, now_seconds=171, last_scale_seconds=50).desired == 18


def test_a_forecast_floor_raises_but_never_exceeds_the_bounds() -> None:
    assert decide(3, [_util(0.5)], P, now_seconds=0, floor=9).desired == 7  # +4 per decision
    assert decide(3, [_util(0.5)], P, now_seconds=0, floor=900).desired == 7
