"""Cost-aware placement reports: what the broker chose, what it cost, and what it saved.

``build_report(records) -> Report`` turns decision records (:mod:`broker.decisions`) into a
:class:`Report`; ``render_html`` / ``render_csv`` / ``render_json`` write it; ``write_report`` does it
all from a database URL (what ``make demo`` and ``broker report placements`` call).
"""

from __future__ import annotations

from broker.reports.build import BASELINE_LABELS, build_report
from broker.reports.model import (
    SCHEMA_ID,
    Baseline,
    DailySpend,
    DeadlineSummary,
    EgressRow,
    JobDecision,
    OptionView,
    Report,
    ReportFilters,
    SpendRow,
    Summary,
    WhatIf,
)
from broker.reports.render import CSV_COLUMNS, render_csv, render_html, render_json
from broker.reports.store import FORMATS, load_records, parse_when, report_from_store, write_report

__all__ = [
    "BASELINE_LABELS",
    "CSV_COLUMNS",
    "FORMATS",
    "SCHEMA_ID",
    "Baseline",
    "DailySpend",
    "DeadlineSummary",
    "EgressRow",
    "JobDecision",
    "OptionView",
    "Report",
    "ReportFilters",
    "SpendRow",
    "Summary",
    "WhatIf",
    "build_report",
    "load_records",
    "parse_when",
    "render",
    "render_csv",
    "render_html",
    "render_json",
    "report_from_store",
    "write_report",
]


def render(report: Report, fmt: str) -> str:
    """``report`` in ``fmt`` (``html``, ``csv`` or ``json``). Raises ``ValueError`` for another format."""
    if fmt == "html":
        return render_html(report)
    if fmt == "csv":
        return render_csv(report)
    if fmt == "json":
        return render_json(report)
    raise ValueError(f"unknown report format {fmt!r}. To fix: use one of {', '.join(FORMATS)}")
