"""Arrival forecasts for predictive pools: Holt-Winters exponential smoothing (statsmodels
``ExponentialSmoothing``, additive seasonality) over arrival counts binned by ``bucket_seconds``.

:class:`ArrivalForecaster` keeps the arrival history it is fed, refits every ``refit_seconds`` of the
caller's clock once it has ``min_seasons`` full seasons, and answers the expected arrival *rate* (per
second) at a future time. Before it has enough history it answers ``None`` and the pool stays reactive.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

__all__ = ["holt_winters_forecast", "ArrivalForecaster", "replicas_for_rate"]


def holt_winters_forecast(counts: np.ndarray, season_length: int, horizon: int) -> np.ndarray:
    """The next ``horizon`` values of ``counts`` by additive Holt-Winters (no trend), clipped at 0."""
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    y = np.asarray(counts, dtype=float)
    with warnings.catch_warnings():  # statsmodels warns on convergence details of its optimiser
        warnings.simplefilter("ignore")
        model = ExponentialSmoothing(y, trend=None, seasonal="add", seasonal_periods=season_length,
                                     initialization_method="heuristic").fit()
        out = model.forecast(horizon)
    return np.clip(np.asarray(out, dtype=float), 0.0, None)


def replicas_for_rate(rate_per_second: float, service_seconds: float, slots_per_replica: int,
                      target_utilization: float) -> int:
    """Replicas to keep busy work at ``target_utilization``: Little's law, ``rate x service`` busy slots."""
    busy = rate_per_second * service_seconds
    return int(math.ceil(busy / (slots_per_replica * target_utilization) - 1e-9))


@dataclass
class ArrivalForecaster:
    bucket_seconds: float = 1800.0
    season_seconds: float = 86400.0
    min_seasons: int = 2
    refit_seconds: float = 12 * 3600.0
    history_seasons: int = 7
    _counts: Counter[int] = field(default_factory=Counter, repr=False)
    _fitted_at: float | None = None
    _origin_bucket: int = 0
    _forecast: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    @property
    def season_length(self) -> int:
        return int(round(self.season_seconds / self.bucket_seconds))

    def observe(self, t_seconds: float, n: int = 1) -> None:
        self._counts[int(t_seconds // self.bucket_seconds)] += n

    def _refit(self, now_seconds: float) -> None:
        now_b = int(now_seconds // self.bucket_seconds)  # the current bucket is incomplete: not used
        if not self._counts:
            return
        first = min(self._counts)
        start = max(first, now_b - self.history_seasons * self.season_length)
        if now_b - start < self.min_seasons * self.season_length:
            return
        y = np.array([self._counts.get(b, 0) for b in range(start, now_b)], dtype=float)
        self._forecast = holt_winters_forecast(y, self.season_length, 2 * self.season_length)
        self._origin_bucket = now_b
        self._fitted_at = now_seconds
        for b in [b for b in self._counts if b < start]:
            del self._counts[b]

    def rate(self, at_seconds: float, now_seconds: float) -> float | None:
        """Expected arrivals per second in the bucket of ``at_seconds`` (None: not enough history)."""
        if self._fitted_at is None or now_seconds - self._fitted_at >= self.refit_seconds:
            self._refit(now_seconds)
        if self._fitted_at is None:
            return None
        i = int(at_seconds // self.bucket_seconds) - self._origin_bucket
        if i < 0 or i >= self._forecast.size:
            return None
        return float(self._forecast[i]) / self.bucket_seconds
