"""Charts of the HTML report: matplotlib (Agg, no pyplot state) rendered to inline SVG.

Each chart draws aggregated data only (a handful of bars or one point per day), so a report over
100,000 records draws as fast as one over ten. Text stays text in the SVG (``svg.fonttype: none``)
so it is crisp, searchable and printable.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from broker.reports.model import Report  # noqa: E402

__all__ = ["Chart", "charts"]

_PALETTE = ("#2563eb", "#16a34a", "#f59e0b", "#dc2626", "#7c3aed", "#0891b2", "#db2777", "#65a30d")
_RC: Any = {
    "svg.fonttype": "none",
    "svg.hashsalt": "hybrid-broker",
    "font.family": "sans-serif",
    "font.size": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titleweight": "bold",
}


class Chart:
    """One rendered chart: an id, a title and the inline ``<svg>`` markup."""

    __slots__ = ("chart_id", "title", "svg")

    def __init__(self, chart_id: str, title: str, svg: str) -> None:
        self.chart_id = chart_id
        self.title = title
        self.svg = svg


def _to_svg(fig: Figure, chart_id: str) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context({**_RC, "svg.hashsalt": chart_id}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]  # drop the XML prolog and DOCTYPE: this goes inline
    # scale with the page: keep the viewBox, let CSS size it
    svg = re.sub(r'<svg([^>]*?) width="[^"]+" height="[^"]+"', r'<svg\1 class="chart" role="img"', svg, count=1)
    return svg


def _empty(ax: object, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#6b7280")  # type: ignore[attr-defined]
    ax.set_xticks([])  # type: ignore[attr-defined]
    ax.set_yticks([])  # type: ignore[attr-defined]


# Above this ratio between the largest and the smallest non-zero bar, a chart uses a log scale: on a linear
# one the small bars (a few dollars next to one large job) would be invisible slivers.
SKEW_FOR_LOG_SCALE = 50.0


def _skewed(*series: Sequence[float]) -> bool:
    positive = [v for values in series for v in values if v > 0]
    return len(positive) >= 2 and max(positive) / min(positive) > SKEW_FOR_LOG_SCALE


def _hbar(
    chart_id: str,
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    xlabel: str,
    *,
    colors: Sequence[str] | None = None,
    empty: str = "no data in this window",
) -> Chart:
    height = 0.9 + 0.38 * max(1, len(labels))
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(6.0, height))
        ax = fig.add_subplot()
        if labels:
            ys = list(range(len(labels)))[::-1]
            bars = ax.barh(ys, values, color=list(colors or _PALETTE[0:1] * len(labels)), height=0.6)
            for i, bar in enumerate(bars):
                bar.set_gid(f"{chart_id}-bar-{i}")
            ax.set_yticks(ys, labels=list(labels))
            top = max(values) if values else 0.0
            if _skewed(values):
                low = min(v for v in values if v > 0)
                ax.set_xscale("log")
                ax.set_xlim(low / 3, top * 4)
                ax.set_xlabel(f"{xlabel} (log scale)")
                for y, v in zip(ys, values, strict=True):
                    ax.text(max(v, low / 3) * 1.08, y, f"{v:,.2f}", va="center", fontsize=9)
            else:
                ax.set_xlabel(xlabel)
                for y, v in zip(ys, values, strict=True):
                    ax.text(v + top * 0.01, y, f"{v:,.2f}", va="center", fontsize=9)
                ax.set_xlim(0, top * 1.18 if top > 0 else 1)
        else:
            _empty(ax, empty)
        ax.set_title(title, loc="left")
        return Chart(chart_id, title, _to_svg(fig, chart_id))


def _grouped(chart_id: str, title: str, labels: Sequence[str], est: Sequence[float], act: Sequence[float]) -> Chart:
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(6.0, 3.2))
        ax = fig.add_subplot()
        if labels:
            xs = range(len(labels))
            for offset, values, color, label in ((-0.2, est, _PALETTE[0], "estimated"),
                                                 (0.2, act, _PALETTE[1], "actual (finished runs)")):
                bars = ax.bar([x + offset for x in xs], values, width=0.4, color=color, label=label)
                for i, bar in enumerate(bars):
                    bar.set_gid(f"{chart_id}-{'est' if offset < 0 else 'act'}-{i}")
            ax.set_xticks(list(xs), labels=list(labels))
            if _skewed(est, act):
                low = min(v for v in (*est, *act) if v > 0)
                ax.set_yscale("log")
                ax.set_ylim(low / 3, max(*est, *act) * 4)
                ax.set_ylabel("USD (log scale)")
            else:
                ax.set_ylabel("USD")
            ax.legend(frameon=False, fontsize=9)
        else:
            _empty(ax, "no jobs placed in this window")
        ax.set_title(title, loc="left")
        return Chart(chart_id, title, _to_svg(fig, chart_id))


def _daily(report: Report) -> Chart:
    title = "Estimated spend per day (USD)"
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(6.0, 3.0))
        ax = fig.add_subplot()
        days = report.daily
        if days:
            xs = list(range(len(days)))
            ax.bar(xs, [d.estimated_usd for d in days], color=_PALETTE[5], width=0.8)
            step = max(1, len(days) // 8)
            ax.set_xticks(xs[::step], labels=[d.day for d in days][::step], rotation=30, ha="right", fontsize=8)
            ax.set_ylabel("USD")
        else:
            _empty(ax, "no jobs placed in this window")
        ax.set_title(title, loc="left")
        return Chart("chart-daily", title, _to_svg(fig, "chart-daily"))


def charts(report: Report) -> list[Chart]:
    """The report's charts, always the same five (an empty one says so), in page order."""
    b = report.baselines
    short = {
        "single-region": "single cheapest region",
        "on-demand": "all on-demand",
        "ignore-data": "ignore data location",
    }
    labels = ["broker (chosen)"] + [short.get(x.key, x.key) for x in b]
    values = [report.summary.estimated_spend_usd] + [x.cost_usd for x in b]
    colors = [_PALETTE[1]] + [_PALETTE[2]] * len(b)
    out = [
        _hbar("chart-baselines", "Broker vs baselines: total cost (USD)", labels, values, "USD", colors=colors),
        _grouped(
            "chart-providers",
            "Spend by provider (USD)",
            [r.key for r in report.by_provider],
            [r.estimated_usd for r in report.by_provider],
            [r.actual_usd for r in report.by_provider],
        ),
        _hbar(
            "chart-capacity",
            "Spend by capacity kind (USD)",
            [r.key for r in report.by_capacity],
            [r.estimated_usd for r in report.by_capacity],
            "USD",
            colors=_PALETTE[: len(report.by_capacity)] or None,
        ),
        _daily(report),
    ]
    routes = report.egress[:10]
    out.append(
        _hbar(
            "chart-egress",
            "Egress by route, top 10 (USD)",
            [f"{e.source} → {e.destination}" for e in routes],
            [e.usd for e in routes],
            "USD",
            colors=[_PALETTE[3]] * len(routes),
            empty="no data moved in this window",
        )
    )
    return out
