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
