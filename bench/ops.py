"""Fleet-operations figures of issue 14, each on generated data with a fixed seed:

* anomaly detection: precision and recall of the EWMA, seasonal and IsolationForest detectors on labelled
  streams with injected anomalies (the same generators as tests/ops/test_anomaly.py, larger);
* elastic pools: reactive (HPA 70/30 + queue length) vs predictive (Holt-Winters floor) on a daily-cycle
  trace: deadline misses, cost, waits.

    .venv/bin/python bench/ops.py [--days 10] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.ops.anomaly import ForestDetector, ewma_flags, precision_recall, seasonal_flags  # noqa: E402
from broker.ops.poolsim import PoolConfig, daily_trace, simulate_pool  # noqa: E402

STEP, DAY = 300.0, 86400.0


def _anomalies(seed: int) -> dict[str, tuple[float, float]]:
    rng = np.random.default_rng(seed)
    out = {}
    v = 120 + np.cumsum(rng.normal(0, 0.05, 8000)) + rng.normal(0, 2.0, 8000)
    truth = np.zeros(v.size, bool)
    idx = rng.choice(np.arange(200, v.size), 80, replace=False)
    truth[idx] = True
    v[idx] += rng.choice([-1.0, 1.0], 80) * rng.uniform(15, 30, 80)
    out["ewma"] = precision_recall(ewma_flags(v, alpha=0.05, k=5, warmup=100)[200:], truth[200:])
    t = np.arange(int(21 * DAY / STEP)) * STEP
    base = 0.5 + 0.3 * np.sin(2 * np.pi * t / DAY)
    v = base + rng.normal(0, 0.02, t.size)
    start = int(3 * DAY / STEP)
    truth = np.zeros(t.size, bool)
    idx = rng.choice(np.arange(start, t.size), 80, replace=False)
    truth[idx] = True
    v[idx] += rng.choice([-1.0, 1.0], 80) * rng.uniform(0.15, 0.3, 80)
    out["seasonal"] = precision_recall(seasonal_flags(t, v, period_seconds=DAY, seasons=7, k=5)[start:], truth[start:])
    cpu = base + rng.normal(0, 0.02, t.size)
    mem = 0.3 + 0.8 * (cpu - 0.5) + rng.normal(0, 0.02, t.size)
    q = 20 * cpu + rng.normal(0, 0.5, t.size)
    X = np.c_[cpu, mem, q]
    train = int(7 * DAY / STEP)
    truth = np.zeros(t.size, bool)
    idx = rng.choice(np.arange(train, t.size), 60, replace=False)
    truth[idx] = True
    for i, kind in zip(idx, rng.integers(0, 3, idx.size), strict=True):
        if kind == 0:
            X[i, 1] += 0.4
        elif kind == 1:
            X[i, 0] += 0.4
            X[i, 2] -= 8
        else:
            X[i, 2] += 15
    det = ForestDetector(contamination=0.0005)
    det.fit(X[:train], 0.0)
    out["isolation_forest"] = precision_recall(det.flags(X[train:]), truth[train:])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    for seed in range(args.seeds):
        pr = _anomalies(seed)
        print(json.dumps({"bench": "anomaly", "seed": seed,
                          **{k: {"precision": round(p, 3), "recall": round(r, 3)} for k, (p, r) in pr.items()}}))
    for seed in range(args.seeds):
        trace = daily_trace(args.days, seed=seed)
        for predictive in (False, True):
            t0 = time.perf_counter()
            res = simulate_pool(trace, PoolConfig(deadline_seconds=1500, predictive=predictive),
                                measure_from_seconds=2 * DAY)
            print(json.dumps({"bench": "pool", "seed": seed, "mode": "predictive" if predictive else "reactive",
                              **res.summary(), "wall_s": round(time.perf_counter() - t0, 2)}))


if __name__ == "__main__":
    main()
