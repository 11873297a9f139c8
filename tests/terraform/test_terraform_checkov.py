"""checkov (in its own venv, .venv-iac) finds no failed check above LOW, and every skip carries its reason.

The JSON report is read without --quiet, which would drop the passed and skipped checks from it."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.terraform.tfload import REPO, tf_files

CHECKOV = REPO / ".venv-iac" / "bin" / "checkov"
SKIP = re.compile(r"#\s*checkov:skip=([A-Z0-9_]+):(.*)$", re.M)


@pytest.fixture(scope="module")
def report() -> list[dict]:
    if not CHECKOV.exists():
        pytest.skip("checkov is not installed: python3 -m venv .venv-iac && .venv-iac/bin/pip install checkov")
    proc = subprocess.run(
        [str(CHECKOV), "-d", "terraform", "--framework", "terraform", "--skip-download", "--compact", "-o", "json"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    return data if isinstance(data, list) else [data]


@pytest.mark.slow
def test_checkov_finds_nothing_above_low(report: list[dict]) -> None:
    failed = [c for r in report for c in r["results"].get("failed_checks", [])]
    serious = [c for c in failed if (c.get("severity") or "UNKNOWN").upper() not in {"LOW", "INFO"}]
    assert serious == [], "\n".join(f"{c['check_id']} {c['resource']} {c['file_path']}" for c in serious)
    assert sum(r["summary"]["passed"] for r in report) > 100


@pytest.mark.slow
def test_every_checkov_skip_gives_a_reason(report: list[dict]) -> None:
    """checkov's JSON does not carry the skip comment, so the reasons are read from the .tf sources."""
    skipped = {c["check_id"] for r in report for c in r["results"].get("skipped_checks", [])}
    assert skipped, "expected the documented inline skips"
    reasons: dict[str, list[str]] = {}
    for path in tf_files():
        for check_id, reason in SKIP.findall(path.read_text()):
            reasons.setdefault(check_id, []).append(reason.strip())
    assert skipped <= set(reasons), f"skips without an inline comment: {sorted(skipped - set(reasons))}"
    short = {k: r for k, rs in reasons.items() for r in rs if len(r) < 20}
    assert short == {}, "each skip needs a reason next to the resource"
