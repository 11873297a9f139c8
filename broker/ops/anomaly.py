"""Anomaly detectors over metric series: pure functions of numpy arrays, plus an IsolationForest model
per group that is retrained on a schedule.

* :func:`ewma_flags`: exponentially weighted mean and variance (``alpha``), each point judged against the
  baseline *before* it; a flagged point does not move the baseline (so one spike does not hide the next).
* :func:`seasonal_flags`: the same phase of the previous ``seasons`` periods gives a median and a robust
  sigma (1.4826 x MAD); a point beyond ``k`` sigma of it is flagged.
* :class:`ForestDetector`: scikit-learn ``IsolationForest`` over several metrics at once (rows aligned by
  time), trained on a window and retrained every ``retrain_seconds`` of the caller's clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["ewma_flags", "seasonal_flags", "ForestDetector", "align", "precision_recall"]


def _outside(value: float, mean: float, sigma: float, k: float, direction: str) -> bool:
    dev = value - mean
    if direction == "above":
        return dev > k * sigma
    if direction == "below":
        return -dev > k * sigma
    return abs(dev) > k * sigma


def ewma_flags(values: np.ndarray, *, alpha: float = 0.1, k: float = 4.0, warmup: int = 20,
               direction: str = "both", min_sigma: float = 1e-6) -> np.ndarray:
    """One boolean per value: outside EWMA mean +/- ``k`` EW standard deviations (see the module docstring).
    The first ``warmup`` values only build the baseline."""
    v = np.asarray(values, dtype=float)
    flags = np.zeros(v.size, dtype=bool)
    if v.size == 0:
        return flags
    head = v[: max(1, min(warmup, v.size))]
    mean = float(np.mean(head))
    var = float(np.var(head))
    for i in range(v.size):
        x = float(v[i])
        sigma = max(np.sqrt(var), min_sigma)
        if i >= warmup and _outside(x, mean, sigma, k, direction):
            flags[i] = True
            continue
        diff = x - mean
        incr = alpha * diff
        mean += incr
        var = (1 - alpha) * (var + diff * incr)
    return flags


def seasonal_flags(t_seconds: np.ndarray, values: np.ndarray, *, period_seconds: float, seasons: int = 7,
                   k: float = 4.0, direction: str = "both", min_sigma: float = 1e-6,
                   bucket_seconds: float | None = None, min_residuals: int = 30) -> np.ndarray:
    """One boolean per value: outside the seasonal rolling baseline (see the module docstring).

    Points fall in phase buckets of ``bucket_seconds`` (default: period / 96). The baseline of a point is
    the median of the same and the two neighbouring buckets in each of the previous ``seasons`` periods;
    its sigma is the robust spread (1.4826 x MAD) of the last period's residuals against that baseline (a
    few points per bucket give no stable spread). Before ``min_residuals`` residuals exist nothing is flagged.
    """
    t = np.asarray(t_seconds, dtype=float)
    v = np.asarray(values, dtype=float)
    flags = np.zeros(v.size, dtype=bool)
    if v.size == 0:
        return flags
    bucket = bucket_seconds or period_seconds / 96.0
    n_buckets = max(1, int(round(period_seconds / bucket)))
    season_idx = np.floor(t / period_seconds).astype(np.int64)
    phase = np.floor((t % period_seconds) / bucket).astype(np.int64) % n_buckets
    history: dict[tuple[int, int], list[float]] = {}
    residuals: list[float] = []
    keep = max(min_residuals, int(period_seconds / max(1.0, float(np.median(np.diff(t))) if t.size > 1 else 1.0)))
    for i in range(v.size):
        s, p = int(season_idx[i]), int(phase[i])
        ref: list[float] = []
        for back in range(1, seasons + 1):
            for dp in (-1, 0, 1):
                ref.extend(history.get((s - back, (p + dp) % n_buckets), ()))
        x = float(v[i])
        flagged = False
        if len(ref) >= 3:
            med = float(np.median(ref))
            if len(residuals) >= min_residuals:
                r = np.asarray(residuals[-keep:])
                sigma = max(1.4826 * float(np.median(np.abs(r - np.median(r)))), min_sigma)
                flagged = _outside(x, med, sigma, k, direction)
            if not flagged:
                residuals.append(x - med)
        flags[i] = flagged
        if not flagged:  # a flagged point joins neither the baseline nor the spread
            history.setdefault((s, p), []).append(x)
    return flags


def align(columns: list[tuple[np.ndarray, np.ndarray]], step_seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows of several series at common times: each ``(t_seconds, values)`` is binned to ``step_seconds``
    (last value per bin); returns ``(t, X)`` over the bins every series has."""
    if not columns:
        return np.zeros(0), np.zeros((0, 0))
    binned: list[dict[int, float]] = []
    for t, v in columns:
        b = np.floor(np.asarray(t) / step_seconds).astype(np.int64)
        binned.append(dict(zip(b.tolist(), np.asarray(v, dtype=float).tolist(), strict=True)))
    common = sorted(set.intersection(*(set(d) for d in binned)))
    X = np.array([[d[b] for d in binned] for b in common], dtype=float).reshape(len(common), len(binned))
    return np.asarray(common, dtype=float) * step_seconds, X


@dataclass
class ForestDetector:
    """IsolationForest on whitened rows; ``fit`` on a training window, ``flags`` for new rows.

    ``contamination`` sets the score threshold on the training rows (the share judged anomalous there)."""

    contamination: float = 0.01
    retrain_seconds: float = 6 * 3600.0
    random_state: int = 0
    n_estimators: int = 200
    trained_at: float | None = None
    _model: object | None = field(default=None, repr=False)
    _mu: np.ndarray | None = field(default=None, repr=False)
    _sd: np.ndarray | None = field(default=None, repr=False)

    def due(self, now_seconds: float) -> bool:
        """True when never trained or the last training is ``retrain_seconds`` old."""
        return self.trained_at is None or now_seconds - self.trained_at >= self.retrain_seconds

    def fit(self, X: np.ndarray, now_seconds: float) -> None:
        from sklearn.ensemble import IsolationForest

        X = np.asarray(X, dtype=float)
        self._mu = X.mean(axis=0)
        # PCA whitening: metrics of one pool move together, and an anomaly is often a break of that
        # relation (memory up while CPU is flat); whitened, such a break lies along a low-variance axis
        # where the forest's axis-parallel splits isolate it quickly.
        cov = np.atleast_2d(np.cov(X - self._mu, rowvar=False))
        eigvals, eigvecs = np.linalg.eigh(cov)
        self._sd = eigvecs / np.sqrt(np.maximum(eigvals, 1e-12 * max(1.0, float(eigvals.max()))))
        model = IsolationForest(n_estimators=self.n_estimators, contamination=self.contamination,
                                random_state=self.random_state)
        model.fit((X - self._mu) @ self._sd)
        self._model = model
        self.trained_at = now_seconds

    def flags(self, X: np.ndarray) -> np.ndarray:
        if self._model is None or self._mu is None or self._sd is None:
            raise RuntimeError("ForestDetector.flags before fit")
        Z = (np.asarray(X, dtype=float) - self._mu) @ self._sd
        return np.asarray(self._model.predict(Z) == -1)  # type: ignore[attr-defined]


def precision_recall(flags: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """Precision and recall of boolean ``flags`` against boolean ``truth`` (1.0 when nothing to find)."""
    f, y = np.asarray(flags, bool), np.asarray(truth, bool)
    tp = int(np.sum(f & y))
    precision = tp / int(np.sum(f)) if np.sum(f) else 1.0
    recall = tp / int(np.sum(y)) if np.sum(y) else 1.0
    return precision, recall
