"""Detectors on generated, labelled metric streams: injected anomalies are caught with precision and
recall of at least 0.9 (the acceptance criterion of issue 14); a clean stream raises next to nothing."""

from __future__ import annotations

import numpy as np

from broker.ops.anomaly import ForestDetector, align, ewma_flags, precision_recall, seasonal_flags

STEP = 300.0  # 5-minute samples
DAY = 86400.0


def _daily(days: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(seed)
    t = np.arange(int(days * DAY / STEP)) * STEP
    return t, 0.5 + 0.3 * np.sin(2 * np.pi * t / DAY), rng


def _inject(values: np.ndarray, start: int, count: int, rng: np.random.Generator, lo: float, hi: float
            ) -> np.ndarray:
    truth = np.zeros(values.size, dtype=bool)
    idx = rng.choice(np.arange(start, values.size), count, replace=False)
    truth[idx] = True
    values[idx] += rng.choice([-1.0, 1.0], count) * rng.uniform(lo, hi, count)
    return truth


def test_ewma_band_catches_spikes_in_a_level_stream() -> None:
    rng = np.random.default_rng(3)
    v = 120 + np.cumsum(rng.normal(0, 0.05, 4000)) + rng.normal(0, 2.0, 4000)  # queue wait, slow drift
    truth = _inject(v, 200, 40, rng, 15, 30)
    p, r = precision_recall(ewma_flags(v, alpha=0.05, k=5, warmup=100)[200:], truth[200:])
    assert p >= 0.9 and r >= 0.9, (p, r)


def test_seasonal_baseline_catches_off_season_points_that_a_flat_threshold_misses() -> None:
    t, base, rng = _daily(14, seed=7)
    v = base + rng.normal(0, 0.02, t.size)
    truth = _inject(v, int(3 * DAY / STEP), 40, rng, 0.15, 0.3)
    flags = seasonal_flags(t, v, period_seconds=DAY, seasons=7, k=5)
    judged = slice(int(3 * DAY / STEP), None)
    p, r = precision_recall(flags[judged], truth[judged])
    assert p >= 0.9 and r >= 0.9, (p, r)
    # many injected dips sit inside the daily range: a static "> 0.9" threshold finds few of them
    _, r_static = precision_recall((v > 0.9)[judged], truth[judged])
    assert r_static < 0.5


def test_isolation_forest_catches_multi_metric_anomalies() -> None:
    t, base, rng = _daily(14, seed=11)
    cpu = base + rng.normal(0, 0.02, t.size)
    mem = 0.3 + 0.8 * (cpu - 0.5) + rng.normal(0, 0.02, t.size)
    queue = 20 * cpu + rng.normal(0, 0.5, t.size)
    X = np.c_[cpu, mem, queue]
    train = int(7 * DAY / STEP)
    truth = np.zeros(t.size, dtype=bool)
    idx = rng.choice(np.arange(train, t.size), 30, replace=False)
    truth[idx] = True
    for i, kind in zip(idx, rng.integers(0, 3, idx.size), strict=True):
        if kind == 0:
            X[i, 1] += 0.4  # memory jumps while CPU is flat: a break of the relation, not of the range
        elif kind == 1:
            X[i, 0] += 0.4
            X[i, 2] -= 8  # CPU busy while the queue drains
        else:
            X[i, 2] += 15  # a queue burst
    det = ForestDetector(contamination=0.0005, n_estimators=100)
    assert det.due(0.0)
    det.fit(X[:train], now_seconds=0.0)
    assert not det.due(3600.0) and det.due(6 * 3600.0)  # retrained on its schedule
    p, r = precision_recall(det.flags(X[train:]), truth[train:])
    assert p >= 0.9 and r >= 0.9, (p, r)


def test_a_clean_stream_raises_almost_nothing() -> None:
    t, base, rng = _daily(10, seed=5)
    v = base + rng.normal(0, 0.02, t.size)
    assert seasonal_flags(t, v, period_seconds=DAY, seasons=7, k=5).sum() <= 2
    assert ewma_flags(rng.normal(10, 1, 3000), alpha=0.05, k=5).sum() <= 2


def test_align_keeps_the_common_times_of_several_series() -> None:
    t, X = align([(np.array([0.0, 60, 120, 180]), np.array([1.0, 2, 3, 4])),
                  (np.array([60.0, 120, 240]), np.array([20.0, 30, 50]))], 60.0)
    assert t.tolist() == [60.0, 120.0] and X.tolist() == [[2.0, 20.0], [3.0, 30.0]]
