"""The agent installs from the built wheel into a fresh venv with only the ``edge`` extra, and runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.edge.conftest import REPO, new_token

pytestmark = [pytest.mark.slow, pytest.mark.network]


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, **kw)


def test_agent_installs_from_the_wheel_with_only_the_edge_extra(tmp_path: Path, edge_api: Any,
                                                                store: Any) -> None:
    src = tmp_path / "src"  # build from a copy: the checkout is shared and must stay untouched
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv*", ".git", "build", "dist", "*.egg-info",
                                                             "__pycache__", "tests", "bench", "terraform", "docs",
                                                             "examples", "*_cache"))
    r = _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"),
              str(src)])
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("hybrid_broker-*.whl")
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    pip = _run([str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check", f"{wheel}[edge]"])
    if pip.returncode != 0 and "Could not find a version" in pip.stderr + pip.stdout:
        pytest.skip("the package registry is unreachable: " + pip.stderr[-300:])
    assert pip.returncode == 0, pip.stderr[-2000:]
    frozen = _run([str(venv / "bin/pip"), "freeze"]).stdout.lower()
    for server_dep in ("fastapi", "sqlmodel", "numpy", "typer", "uvicorn"):
        assert server_dep not in frozen  # the edge extra pulls only what the agent needs
    agent = str(venv / "bin/edge-agent")
    r = _run([agent, "--help"])
    assert r.returncode == 0 and "enroll" in r.stdout and "status" in r.stdout
    r = _run([agent, "--state-dir", str(tmp_path / "state"), "enroll", "--broker", edge_api.url,
              "--token", new_token(store), "--device-id", "wheel-dev"])
    assert r.returncode == 0, r.stderr
    r = _run([agent, "--state-dir", str(tmp_path / "state"), "status"])
    assert r.returncode == 0 and "wheel-dev" in r.stdout
