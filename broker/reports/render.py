"""Render a :class:`~broker.reports.model.Report` as HTML, CSV or JSON.

* HTML: one self-contained file (inline CSS and SVG, no script, no network), readable on a
  laptop screen and printable (print CSS). The decisions table shows the latest
  ``max_html_decisions`` jobs; the CSV and JSON carry all of them.
* CSV: one row per job decision, typed columns (numbers plain, datetimes ISO 8601 UTC, empty = missing).
* JSON: ``Report.to_dict()``, valid against ``docs/schemas/placement-report.schema.json``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import datetime
from html import escape
from typing import Any

import orjson

from broker.reports.model import Report, SpendRow, decision_dicts

__all__ = ["render_html", "render_csv", "render_json", "CSV_COLUMNS"]

CSV_COLUMNS: tuple[str, ...] = (
    "record_id",
    "created_at",
    "job_id",
    "job_name",
    "namespace",
    "placed",
    "provider",
    "region",
    "instance_type",
    "capacity",
    "site",
    "hourly_usd",
    "compute_usd",
    "egress_usd",
    "transfer_hours",
    "total_usd",
    "runner_up_location",
    "runner_up_instance_type",
    "runner_up_capacity",
    "runner_up_total_usd",
    "margin_usd",
    "data_gib",
    "considered",
    "feasible",
    "policy",
    "catalog_version",
    "deadline",
    "predicted_finish_at",
    "deadline_met_predicted",
    "finished_at",
    "runtime_hours",
    "actual_cost_usd",
    "deadline_met",
    "why",
)


def _iso(v: datetime | None) -> str:
    return "" if v is None else v.isoformat()


def _num(v: float | int | None) -> str:
    if v is None:
        return ""
    return repr(round(float(v), 6)) if isinstance(v, float) else str(v)


def _bool(v: bool | None) -> str:
    return "" if v is None else ("true" if v else "false")


_NO_OPTION: dict[str, Any] = {}


def _csv_row(d: dict[str, Any]) -> list[str]:
    """One CSV row from a decision's JSON form (see ``Report.to_dict()``)."""
    c, u = d["chosen"], d["runner_up"]
    o = c or _NO_OPTION
    return [
        _num(d["record_id"]),
        d["created_at"] or "",
        d["job_id"] or "",
        d["job_name"],
        d["namespace"] or "",
        _bool(c is not None),
        o.get("provider", ""),
        o.get("region", ""),
        o.get("instance_type", ""),
        o.get("capacity", ""),
        o.get("site", ""),
        _num(o.get("hourly_usd")),
        _num(o.get("compute_usd")),
        _num(o.get("egress_usd")),
        _num(o.get("transfer_hours")),
        _num(o.get("total_usd")),
        u["location"] if u else "",
        u["instance_type"] if u else "",
        u["capacity"] if u else "",
        _num(u["total_usd"] if u else None),
        _num(d["margin_usd"]),
        _num(float(d["data_gib"])),
        _num(d["considered"]),
        _num(d["feasible"]),
        d["policy"],
        d["catalog_version"],
        d["deadline"] or "",
        d["predicted_finish_at"] or "",
        _bool(d["deadline_met_predicted"]),
        d["finished_at"] or "",
        _num(d["runtime_hours"]),
        _num(d["actual_cost_usd"]),
        _bool(d["deadline_met"]),
        d["why"],
    ]


def render_csv(report: Report) -> str:
    """One row per job decision with the columns of :data:`CSV_COLUMNS` (header first)."""
    from broker.reports.build import no_gc

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    with no_gc():
        w.writerows(_csv_row(d) for d in decision_dicts(report.decisions))
    return buf.getvalue()


def render_json(report: Report, *, indent: int | None = None) -> str:
    """The report as a JSON document (see ``docs/schemas/placement-report.schema.json``); any
    ``indent`` pretty-prints with two spaces."""
    from broker.reports.build import no_gc

    option = orjson.OPT_INDENT_2 if indent else 0
    with no_gc():
        return orjson.dumps(report.to_dict(), option=option).decode("utf-8")


# ---------------------------------------------------------------- HTML

_CSS = """
:root{--fg:#111827;--muted:#6b7280;--line:#e5e7eb;--accent:#2563eb;--good:#15803d;--bad:#b91c1c}
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
 margin:0;background:#f9fafb}
main{max-width:1180px;margin:0 auto;padding:24px 28px 48px;background:#fff}
h1{font-size:1.6rem;margin:0 0 4px}h2{font-size:1.2rem;margin:32px 0 10px;border-bottom:2px solid var(--line);
 padding-bottom:4px}
.meta{color:var(--muted);font-size:.9rem;margin:0 0 16px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(140px,1fr));gap:12px}
.card{border:1px solid var(--line);border-radius:8px;padding:10px 14px}
.card .v{font-size:1.35rem;font-weight:650}.card .k{color:var(--muted);font-size:.82rem}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:16px;align-items:start}
.tables2{display:grid;grid-template-columns:repeat(auto-fit,minmax(500px,1fr));gap:0 24px}.tables2>div{overflow-x:auto}
.key{white-space:nowrap}h3{font-size:1rem;margin:14px 0 4px}
figure{margin:0;border:1px solid var(--line);border-radius:8px;padding:8px;break-inside:avoid}
svg.chart{width:100%;height:auto;display:block}
table{border-collapse:collapse;width:100%;font-size:.88rem;margin:6px 0 12px}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{background:#f3f4f6;font-weight:600}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;
 white-space:nowrap}
.good{color:var(--good);font-weight:600}.bad{color:var(--bad);font-weight:600}.muted{color:var(--muted)}
td.why{font-size:.82rem;max-width:520px}
.note{color:var(--muted);font-size:.85rem}
@media print{body{background:#fff;font-size:11px}main{max-width:none;padding:0}
 .grid2{grid-template-columns:1fr 1fr}h2{break-after:avoid}tr,figure,.card{break-inside:avoid}
 thead{display:table-header-group}a{color:inherit;text-decoration:none}}
@page{size:A4;margin:14mm}
"""


def _m(x: float | None) -> str:
    return "—" if x is None else f"${x:,.2f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f'<th class="n">{escape(h)}</th>' if i in numeric else f"<th>{escape(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            cls = ' class="n"' if i in numeric else ""
            cells.append(f"<td{cls}>{v}</td>")  # values are escaped by the callers
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _spend_table(rows: Sequence[SpendRow], what: str) -> str:
    return _table(
        [what, "jobs", "estimated", "compute", "egress", "actual (runs)"],
        [
            [f'<span class="key">{escape(r.key)}</span>', f"{r.jobs:,}", _m(r.estimated_usd), _m(r.compute_usd),
             _m(r.egress_usd), f"{_m(r.actual_usd)} ({r.finished_jobs:,})" if r.finished_jobs else "—"]
            for r in rows
        ],
        numeric=(1, 2, 3, 4, 5),
    )


def _ok(v: bool | None) -> str:
    if v is None:
        return '<span class="muted">—</span>'
    return '<span class="good">met</span>' if v else '<span class="bad">missed</span>'


def render_html(report: Report, *, max_html_decisions: int = 500, title: str = "Placement report") -> str:
    """The report as one self-contained HTML page (inline CSS and SVG charts, no scripts)."""
    from broker.reports.charts import charts

    s = report.summary
    f = report.filters
    window = (
        f"namespace <b>{escape(f.namespace or 'all')}</b>, "
        f"from <b>{escape(_iso(f.since) or (s.first_at.isoformat() if s.first_at else '—'))}</b> "
        f"to <b>{escape(_iso(f.until) or (s.last_at.isoformat() if s.last_at else '—'))}</b>"
    )
    best = max(report.baselines, key=lambda b: b.savings_usd, default=None)
    cards = [
        ("jobs placed", f"{s.jobs_placed:,}"),
        ("estimated spend", _m(s.estimated_spend_usd)),
        (f"of it dry-run, simulated ({s.dry_run_jobs:,} jobs)", _m(s.dry_run_usd)),
        (f"actual spend ({s.finished_jobs:,} finished runs)", _m(s.actual_spend_usd)),
        ("data moved", f"{s.data_moved_gib:,.1f} GiB"),
        ("egress cost", _m(s.egress_usd)),
        ("best saving vs a baseline", _m(best.savings_usd) if best else "—"),
        ("unplaceable / previews", f"{s.unplaced:,} / {s.previews:,}"),
    ]
    parts: list[str] = []
    parts.append(f"<h1>{escape(title)}</h1>")
    parts.append(
        f'<p class="meta">{window}. Generated {escape(report.generated_at.isoformat(timespec="seconds"))}. '
        f"Prices are those stored with each decision (catalog versions: "
        f"{escape(', '.join(report.catalog_versions[:6]) or '—')}"
        f"{'…' if len(report.catalog_versions) > 6 else ''}).</p>"
    )
    parts.append('<section id="summary"><div class="cards">' + "".join(
        f'<div class="card"><div class="v">{v}</div><div class="k">{escape(k)}</div></div>' for k, v in cards
    ) + "</div></section>")

    chart_list = charts(report)
    by_id = {c.chart_id: c for c in chart_list}

    def fig(cid: str) -> str:
        c = by_id[cid]
        return f'<figure id="{c.chart_id}" aria-label="{escape(c.title)}">{c.svg}</figure>'

    # savings
    parts.append('<section id="savings"><h2>Savings against baselines</h2><div class="grid2">')
    parts.append(fig("chart-baselines"))
    parts.append("<div>" + _table(
        ["baseline", "cost", "savings", "%", "priced exactly"],
        [[escape(b.label) + (f'<div class="note">{escape(b.detail)}</div>' if b.detail else ""),
          _m(b.cost_usd),
          f'<span class="{"good" if b.savings_usd >= 0 else "bad"}">{_m(b.savings_usd)}</span>',
          f"{b.savings_pct:.1f}%", f"{b.exact_jobs:,} / {b.jobs:,}"] for b in report.baselines],
        numeric=(1, 2, 3, 4),
    ) + '<p class="note">Each decision stores, when it is made, what every baseline would have cost '
        "(same catalog, egress and constraints); the savings are the difference of the two sums over the "
        "jobs counted (see docs/REPORTS.md).</p></div></div></section>")

    # spend
    parts.append('<section id="spend"><h2>Spend</h2>')
    if s.dry_run_jobs:
        parts.append(
            f'<p class="note" id="dry-run-note"><b>{_m(s.dry_run_usd)} of the estimated spend '
            f"({s.dry_run_jobs:,} of {s.jobs_placed:,} jobs) ran in dry-run mode</b>: those providers had no "
            "credentials, so their instances were simulated and nothing was paid (their actual spend is simulated "
            "too).</p>"
        )
    parts.append('<div class="grid2">')
    parts.append(fig("chart-providers") + fig("chart-capacity"))
    parts.append(fig("chart-daily") + "</div>")
    parts.append('<div class="tables2"><div><h3>By provider</h3>' + _spend_table(report.by_provider, "provider")
                 + "</div><div><h3>By capacity kind</h3>" + _spend_table(report.by_capacity, "capacity") + "</div>")
    parts.append("<div><h3>By namespace</h3>" + _spend_table(report.by_namespace, "namespace") + "</div>")
    parts.append("<div><h3>By region (top 15)</h3>" + _spend_table(report.by_region[:15], "region")
                 + "</div></div></section>")

    # egress
    parts.append('<section id="egress"><h2>Data movement</h2><div class="grid2">' + fig("chart-egress") + "<div>")
    parts.append(_table(
        ["source", "destination", "GiB", "cost", "jobs"],
        [[escape(e.source), escape(e.destination), f"{e.gib:,.1f}", _m(e.usd), e.jobs] for e in report.egress[:12]],
        numeric=(2, 3, 4),
    ) if report.egress else '<p class="note">No data moved: every input was read where its job ran.</p>')
    if len(report.egress) > 12:
        parts.append(f'<p class="note">Top 12 of {len(report.egress):,} routes by cost; the JSON lists them all.</p>')
    parts.append("</div></div></section>")

    # deadlines
    d = report.deadlines
    parts.append('<section id="deadlines"><h2>Deadlines</h2>')
    parts.append(_table(
        ["jobs with a deadline", "predicted to meet", "finished", "met", "missed", "their cost",
         "offers too slow", "what meeting them cost"],
        [[d.jobs_with_deadline, d.met_predicted, d.finished, f'<span class="good">{d.met}</span>',
          f'<span class="bad">{d.missed}</span>' if d.missed else "0", _m(d.cost_usd), f"{d.offers_too_slow:,}",
          _m(d.premium_usd)]],
        numeric=(0, 1, 2, 3, 4, 5, 6, 7),
    ) + f'<p class="note">{escape(d.premium_note)}</p></section>')

    # what-if
    parts.append('<section id="whatif"><h2>What if</h2>')
    parts.append(_table(
        ["scenario", "status", "jobs re-placed", "recorded cost", "what-if cost", "difference", "moved",
         "unplaceable"],
        [[escape(w.label), escape(w.status) + (f'<div class="note">{escape(w.reason)}</div>' if w.reason else ""),
          f"{w.jobs_replaced:,} / {w.jobs_total:,}", _m(w.recorded_usd) if w.status == "ok" else "—",
          _m(w.whatif_usd) if w.status == "ok" else "—",
          (f'<span class="{"good" if w.delta_usd >= 0 else "bad"}">{_m(w.delta_usd)}</span>'
           if w.status == "ok" else "—"),
          w.moved, w.unplaceable] for w in report.whatif],
        numeric=(2, 3, 4, 5, 6, 7),
    ) + '<p class="note">Jobs re-placed against the catalog version each decision used. A positive difference '
        "means the alternative policy would have cost more.</p></section>")

    # decisions
    shown = report.decisions[-max_html_decisions:][::-1] if max_html_decisions > 0 else ()
    parts.append('<section id="decisions"><h2>Decisions</h2>')
    if len(shown) < len(report.decisions):
        parts.append(f'<p class="note">The latest {len(shown):,} of {len(report.decisions):,} decisions; '
                     "the CSV and JSON formats list them all.</p>")
    rows = []
    for x in shown:
        c, u = x.chosen, x.runner_up
        rows.append([
            escape(x.created_at.strftime("%Y-%m-%d %H:%M")),
            escape(x.job_name) + f'<div class="note">{escape(x.namespace or "")}</div>',
            escape(f"{c.provider} {c.region}") + f'<div class="note">{escape(f"{c.instance_type}, {c.capacity}")}</div>'
            if c else '<span class="bad">not placed</span>',
            _m(c.total_usd if c else None),
            escape(f"{u.provider} {u.region}") + f'<div class="note">{escape(u.capacity)}</div>' if u else "—",
            _m(u.total_usd if u else None),
            _ok(x.deadline_met if x.deadline_met is not None else x.deadline_met_predicted)
            if x.deadline else '<span class="muted">—</span>',
            f'<span class="why">{escape(x.why)}</span>',
        ])
    parts.append(_table(["placed", "job", "choice", "total", "runner-up", "its total", "deadline", "why"],
                        rows, numeric=(3, 5)).replace("<td><span class=\"why\">", '<td class="why"><span>'))
    parts.append("</section>")

    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width,initial-scale=1"><link rel="icon" href="data:,">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>"
        f'<body><main data-charts="{len(chart_list)}">\n{body}\n</main></body></html>\n'
    )
