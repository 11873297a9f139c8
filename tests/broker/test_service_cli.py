"""The service CLI (``broker submit``, ``jobs``, ``namespaces``, ``tokens``) against a real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.broker.service_support import ADMIN, job_doc, make_app, serve_in_thread

CLI = [sys.executable, "-c", "import sys; from broker.cli import main; main(sys.argv[1:])"]


def _run(args: list[str], url: str, token: str = ADMIN) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")} | {
        "BROKER_URL": url, "BROKER_TOKEN": token}
    return subprocess.run(CLI + args, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args,code,needle",
    [(["jobs", "list"], 1, "cannot reach the broker"),
     (["submit", "/nonexistent/job.yaml"], 2, "no such file")],
    ids=["an unreachable broker", "a missing spec file"],
)
def test_errors_print_one_line_and_exit_non_zero(args: list[str], code: int, needle: str) -> None:
    r = _run(args, "http://127.0.0.1:9")
    assert r.returncode == code and needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_namespaces_tokens_submit_and_jobs(tmp_path: Path, store_url: str) -> None:
    app = make_app(tmp_path, store_url)
    spec = tmp_path / "jobs.yaml"
    spec.write_text("---\n".join(yaml.safe_dump(job_doc(f"cli-{i}")) for i in range(3)))
    with serve_in_thread(app) as url:
        assert _run(["namespaces", "create", "team-cli"], url).stdout.strip() == "team-cli"
        token = _run(["tokens", "create", "--namespace", "team-cli"], url).stdout.strip()
        assert token.startswith("hb_")
        sub = _run(["submit", str(spec)], url, token)
        assert sub.returncode == 0, sub.stderr
        ids = [line.split()[0] for line in sub.stdout.splitlines()]
        assert len(ids) == 3
        listed = _run(["jobs", "list"], url, token)
        assert [line.split()[0] for line in listed.stdout.splitlines()] == ids
        got = _run(["jobs", "get", ids[0], "--json"], url, token)
        assert '"state": "PENDING"' in got.stdout
        shown = _run(["jobs", "get", ids[0]], url, token)  # the readable view: state and the submit event
        assert shown.returncode == 0 and f"team-cli/cli-0  {ids[0]}  PENDING" in shown.stdout
        assert "events" in shown.stdout and "PENDING" in shown.stdout.split("events", 1)[1]
        assert "CANCELLED" in _run(["jobs", "cancel", ids[0]], url, token).stdout
        other = _run(["jobs", "get", ids[0], "--namespace", "default"], url, token)
        assert other.returncode == 1 and "404" in other.stderr
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump(job_doc("bad", memory="32GB")))
        r = _run(["submit", str(bad)], url, token)
        assert r.returncode == 2 and "spec.resources.requests.memory" in r.stderr


def test_submit_sends_each_spec_to_its_own_namespace(tmp_path: Path, store_url: str) -> None:
    app = make_app(tmp_path, store_url)
    files = []
    for ns, names in (("team-x", ["x-1", "x-2"]), ("team-y", ["y-1"])):
        f = tmp_path / f"{ns}.yaml"
        docs = [job_doc(n) | {"metadata": {"name": n, "namespace": ns}} for n in names]
        f.write_text("---\n".join(yaml.safe_dump(d) for d in docs))
        files.append(str(f))
    with serve_in_thread(app) as url:
        for ns in ("team-x", "team-y"):
            assert _run(["namespaces", "create", ns], url).returncode == 0
        sub = _run(["submit", *files], url)
        assert sub.returncode == 0, sub.stderr
        placed = sorted(line.split()[1] for line in sub.stdout.splitlines())
        assert placed == ["team-x/x-1", "team-x/x-2", "team-y/y-1"]
        for ns, want in (("team-x", 2), ("team-y", 1)):
            listed = _run(["jobs", "list", "--namespace", ns], url)
            assert len(listed.stdout.splitlines()) == want, listed.stdout
        # --namespace still wins, and a spec naming another namespace is refused with the field
        clash = _run(["submit", files[1], "--namespace", "team-x"], url)
        assert clash.returncode == 2 and "metadata.namespace" in clash.stderr
