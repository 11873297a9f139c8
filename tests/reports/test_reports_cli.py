"""`broker report placements` end to end: the real console script against a real SQLite store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlmodel import SQLModel

from broker.decisions import DecisionRecord
from tests.reports.builders import synthetic
from tests.reports.conftest import fill


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    engine = create_engine(f"sqlite:///{root}/broker.db")
    SQLModel.metadata.create_all(engine, tables=[DecisionRecord.__table__])  # type: ignore[attr-defined]
    fill(engine, synthetic(80, seed=2))
    engine.dispose()
    return root


def _broker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    code = "from broker.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, env={**clean, **(env or {})}
    )


def test_the_cli_writes_each_format_from_the_store(data_dir: Path, tmp_path: Path) -> None:
    for fmt in ("html", "csv", "json"):
        out = tmp_path / f"report.{fmt}"
        r = _broker("report", "placements", "--data-dir", str(data_dir), "--since", "2026-01-01",
                    "--namespace", "team-a", "--format", fmt, "--out", str(out))
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(out) and out.stat().st_size > 500
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["summary"]["jobs_placed"] > 0 and {d["namespace"] for d in doc["decisions"]} == {"team-a"}


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--since", "last tuesday"], 2, "--since"),
        (["--since", "2d", "--until", "3d"], 2, "--until"),
        (["--format", "pdf"], 2, "--format"),
        (["--database-url", "sqlite:////nonexistent/dir/broker.db"], 1, "no broker store"),
    ],
    ids=["an unreadable --since", "a window ending before it starts", "an unknown format", "a store that is not there"],
)
def test_bad_input_is_one_line_on_stderr(data_dir: Path, tmp_path: Path, args: list[str], code: int,
                                         needle: str) -> None:
    base = ["report", "placements", "--out", str(tmp_path / "r.html")]
    if "--database-url" not in args:
        base += ["--data-dir", str(data_dir)]
    r = _broker(*base, *args)
    assert r.returncode == code
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "To fix" in lines[0]
    assert "Traceback" not in r.stderr
