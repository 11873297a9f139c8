"""Trends of stored metric series, for ``broker history``: a summary row per series and a PNG plot.

Input is the ``series`` list of ``GET /v1/ops/metrics/{name}``: ``[{labels, points: [[t, v], ...]}]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["trend_rows", "plot_series"]


def _name(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "(no labels)"


def trend_rows(series: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per series: points, first, min, mean, max, last and the least-squares slope per hour."""
    rows = []
    for s in series:
        pts = np.asarray(s["points"], dtype=float).reshape(-1, 2)
        if pts.size == 0:
            continue
        t, v = pts[:, 0], pts[:, 1]
        slope = float(np.polyfit((t - t[0]) / 3600.0, v, 1)[0]) if len(t) >= 2 and np.ptp(t) > 0 else 0.0
        rows.append({"series": _name(s["labels"]), "points": int(len(v)), "first": float(v[0]),
                     "min": float(v.min()), "mean": float(v.mean()), "max": float(v.max()), "last": float(v[-1]),
                     "slope_per_hour": slope})
    return rows


def plot_series(metric: str, series: Sequence[dict[str, Any]], path: Path, *, max_series: int = 12) -> None:
    """Write a PNG line plot of the series (at most ``max_series``, the rest summarised in the title)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
    for s in list(series)[:max_series]:
        pts = np.asarray(s["points"], dtype=float).reshape(-1, 2)
        if pts.size:
            ax.plot(pts[:, 0].astype("datetime64[s]"), pts[:, 1], label=_name(s["labels"]), linewidth=1)
    extra = len(series) - max_series
    ax.set_title(metric + (f" (+{extra} more series)" if extra > 0 else ""))
    ax.set_xlabel("time (UTC)")
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=7, loc="best")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
