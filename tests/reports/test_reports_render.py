"""HTML, CSV and JSON renderings of a report built from a real SQLite store."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
from sqlalchemy import create_engine
from sqlmodel import SQLModel

from broker.decisions import DecisionRecord
from broker.errors import NotFoundError, SpecError
from broker.reports import (
    CSV_COLUMNS,
    Report,
    render,
    render_csv,
    render_html,
    render_json,
    report_from_store,
    write_report,
)
from tests.reports.builders import synthetic
from tests.reports.conftest import fill

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "placement-report.schema.json"


@pytest.fixture(scope="module")
def db_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('reports')}/broker.db"
    engine = create_engine(url)
    SQLModel.metadata.create_all(engine, tables=[DecisionRecord.__table__])  # type: ignore[attr-defined]
    fill(engine, synthetic(250, seed=5))
    engine.dispose()
    return url


@pytest.fixture(scope="module")
def report(db_url: str) -> Report:
    return report_from_store(db_url)


def test_json_validates_against_the_published_schema(report: Report) -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    doc = json.loads(render_json(report))
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    assert len(doc["decisions"]) == len(report.decisions)
    broken = dict(doc, summary={**doc["summary"], "jobs_placed": "many"})
    assert not validator.is_valid(broken)  # the schema does constrain


def test_csv_opens_in_pandas_with_typed_columns(report: Report) -> None:
    df = pd.read_csv(io.StringIO(render_csv(report)), parse_dates=["created_at", "deadline", "finished_at"])
    assert tuple(df.columns) == CSV_COLUMNS
    assert len(df) == len(report.decisions)
    for col in ("hourly_usd", "compute_usd", "egress_usd", "total_usd", "runner_up_total_usd", "margin_usd",
                "data_gib", "transfer_hours"):
        assert pd.api.types.is_float_dtype(df[col]), col
    for col in ("considered", "feasible", "record_id"):
        assert pd.api.types.is_integer_dtype(df[col]), col
    assert pd.api.types.is_bool_dtype(df["placed"])
    for col in ("created_at", "deadline"):
        assert isinstance(df[col].dtype, pd.DatetimeTZDtype), col
    assert df["total_usd"].sum() == pytest.approx(report.summary.estimated_spend_usd)


def test_html_is_one_self_contained_file_with_every_chart(report: Report) -> None:
    page = render_html(report)
    n = int(re.search(r'data-charts="(\d+)"', page).group(1))  # type: ignore[union-attr]
    assert n == 5 and page.count("<svg") == n
    assert "<script" not in page and " src=" not in page
    assert not re.search(r'(href|url)\(?=?["\']?https?://', page)  # nothing to fetch
    assert "@media print" in page
    for b in report.baselines:
        assert b.label in page
    assert report.decisions[-1].job_name in page  # newest decision shown first


@pytest.mark.parametrize("fmt", ["html", "csv", "json"])
def test_write_report_works_on_its_own(db_url: str, tmp_path: Path, fmt: str) -> None:
    path = write_report(tmp_path / "sub" / f"r.{fmt}", fmt, database_url=db_url, namespace="ml")
    text = path.read_text()
    assert path.exists() and text
    if fmt == "json":
        doc = json.loads(text)
        assert doc["filters"]["namespace"] == "ml"
        assert {d["namespace"] for d in doc["decisions"]} == {"ml"}


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda p, u: write_report(p, "pdf", database_url=u), SpecError),
        (lambda p, u: write_report(p, "json", database_url=f"sqlite:///{p.parent}/missing.db"), NotFoundError),
        (lambda p, u: render(report_from_store(u), "xml"), ValueError),
    ],
    ids=["an unknown format is refused", "a missing store is named", "render refuses an unknown format"],
)
def test_bad_input_gets_a_clear_error(db_url: str, tmp_path: Path, call: object, error: type) -> None:
    with pytest.raises(error, match="To fix"):
        call(tmp_path / "r.out", db_url)  # type: ignore[operator]


def _bar_heights(svg: str, prefix: str, *, horizontal: bool = False) -> dict[str, float]:
    """The visible length of each bar ``<g id="{prefix}...">`` of an SVG chart: its path clipped to the axes."""
    x, y, w, h = (float(v) for v in re.search(
        r'<clipPath id="[^"]+">\s*<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"', svg).groups())
    out = {}
    for gid, d in re.findall(rf'<g id="({re.escape(prefix)}[^"]+)">\s*<path d="([^"]+)"', svg):
        coords = [float(v) for v in re.findall(r"-?[\d.]+", d)]
        values = coords[0::2] if horizontal else coords[1::2]
        lo, hi = (x, x + w) if horizontal else (y, y + h)
        out[gid] = min(max(values), hi) - max(min(values), lo)
    return out


def test_small_spend_stays_visible_next_to_one_large_job(report: Report) -> None:
    import dataclasses

    from broker.reports.charts import charts
    from broker.reports.model import SpendRow

    rows = [SpendRow("aws", 1, 9000.0, 9000.0, 0.0, 8000.0, 1), SpendRow("gcp", 3, 2.5, 2.5, 0.0, 0.0, 0),
            SpendRow("azure", 2, 0.8, 0.8, 0.0, 0.5, 1)]
    skewed = dataclasses.replace(report, by_provider=rows, by_capacity=rows)
    by_id = {c.chart_id: c.svg for c in charts(skewed)}
    for chart_id, prefix, horizontal in (("chart-providers", "chart-providers-est-", False),
                                         ("chart-capacity", "chart-capacity-bar-", True)):
        heights = _bar_heights(by_id[chart_id], prefix, horizontal=horizontal)
        assert len(heights) == 3
        assert min(heights.values()) > 0.1 * max(heights.values()), (chart_id, heights)
        assert "log scale" in by_id[chart_id]
    # spend of one order of magnitude keeps the linear scale, where lengths are proportional to dollars
    from broker.reports.charts import _hbar

    svg = _hbar("chart-capacity", "Spend by capacity kind (USD)", ["a", "b", "c"], [30.0, 20.0, 10.0], "USD").svg
    heights = list(_bar_heights(svg, "chart-capacity-bar-", horizontal=True).values())
    assert "log scale" not in svg and heights[0] / heights[2] == pytest.approx(3.0, rel=0.02)


def test_dry_run_spend_is_counted_apart_and_marked(tmp_path: Path, report: Report) -> None:
    from sqlalchemy import text

    decisions = list(synthetic(30, seed=9))
    url = f"sqlite:///{tmp_path}/broker.db"
    engine = create_engine(url)
    SQLModel.metadata.create_all(engine, tables=[DecisionRecord.__table__])  # type: ignore[attr-defined]
    fill(engine, decisions)
    with engine.begin() as conn:  # the broker's jobs table, as far as the report reads it
        conn.execute(text("CREATE TABLE jobs (id VARCHAR(40) PRIMARY KEY, dry_run BOOLEAN NOT NULL)"))
        conn.execute(text("INSERT INTO jobs (id, dry_run) VALUES (:id, :dry)"),
                     [{"id": d.job_id, "dry": int(d.job_id[1:]) % 3 == 0} for d in decisions])
    engine.dispose()
    dry = [d for d in decisions if d.kind == "placement" and d.result.placement is not None
           and int(d.job_id[1:]) % 3 == 0]
    assert dry
    marked = report_from_store(url)
    assert marked.summary.dry_run_jobs == len(dry)
    assert marked.summary.dry_run_usd == pytest.approx(sum(d.result.placement.total_usd for d in dry))  # type: ignore[union-attr]
    assert marked.summary.dry_run_usd < marked.summary.estimated_spend_usd
    html = render_html(marked)
    note = re.search(r'<p class="note" id="dry-run-note">(.*?)</p>', html)
    assert note and f"${marked.summary.dry_run_usd:,.2f}" in note.group(1) and f"{len(dry)} of" in note.group(1)
    jsonschema.validate(json.loads(render_json(marked)), json.loads(SCHEMA.read_text()))
    # a store without a jobs table (decision records only) has no dry-run spend
    assert report.summary.dry_run_jobs == 0 and report.summary.dry_run_usd == 0
