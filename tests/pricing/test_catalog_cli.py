"""`broker catalog offers` says what the catalog lacks when nothing matches, and warns about old prices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.cli import main


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROKER_DATA_DIR", str(tmp_path_factory.getbasetemp() / "cli-data"))
    for var in ("BROKER_CATALOG_DIR", "BROKER_INVENTORY", "BROKER_EGRESS_CONFIG"):
        monkeypatch.delenv(var, raising=False)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else (0 if code is None else 1)), out.out, out.err


def test_an_empty_query_names_what_each_cloud_lacks(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(["catalog", "offers", "--gpu", "H100:8", "--provider", "gcp"], capsys)
    assert code == 1 and out == ""
    line = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and "gcp: no H100 offers" in line[0] and "broker catalog refresh" in line[0]
    code, _, err = run(["catalog", "offers", "--gpu", "T4", "--provider", "aws", "--spot"], capsys)
    assert code == 1 and "aws: no spot offers" in err
    code, _, err = run(["catalog", "offers", "--gpu", "A100:16", "--provider", "aws"], capsys)
    assert code == 1 and "aws: A100 at most 8 per instance" in err


def test_offers_carry_their_outlier_reason_and_old_prices_are_warned(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["catalog", "offers", "--gpu", "A100:8", "--provider", "gcp", "--json"], capsys)
    assert code == 0
    rows = json.loads(out)
    assert rows and all(r["provider"] == "gcp" and r["outlier_reason"] == "" for r in rows)
    assert rows[0]["hourly_usd"] == pytest.approx(29.387081)  # the dated list price (a2-highgpu-8g)
    assert "warning: catalog prices older than 30 days" in err


def test_an_empty_query_names_the_types_left_out_as_superseded(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["catalog", "offers", "--gpu", "H100:8", "--provider", "aws"], capsys)
    line = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 1 and len(line) == 1
    assert "aws: no H100 offers (p5.48xlarge: Libcloud's rows left out, their list price changed later" in line[0]
    code, out, _ = run(["catalog", "info", "--json"], capsys)
    ec2 = [s for s in json.loads(out)["sources"] if s["source"].endswith(":ec2_linux")]
    assert code == 0 and len(ec2) == 1 and ec2[0]["superseded"] > 0
