"""``broker queues get|set`` against a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.broker.service_support import ADMIN, ADMIN_H, make_app, serve_in_thread

CLI = [sys.executable, "-c", "import sys; from broker.cli import main; main(sys.argv[1:])"]


def _run(args: list[str], url: str, token: str = ADMIN) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")} | {
        "BROKER_URL": url, "BROKER_TOKEN": token}
    return subprocess.run(CLI + args, env=env, capture_output=True, text=True, timeout=60)


def test_queues_get_and_set_for_a_namespace_and_the_cluster(tmp_path: Path, store_url: str) -> None:
    app = make_app(tmp_path, store_url)
    with serve_in_thread(app) as url:
        httpx.post(f"{url}/v1/namespaces", json={"name": "team-q"}, headers=ADMIN_H).raise_for_status()

        r = _run(["queues", "set", "team-q", "--discipline", "edf", "--weight", "2.5", "--json"], url)
        assert r.returncode == 0, r.stderr
        answer = json.loads(r.stdout)
        assert (answer["discipline"], answer["weight"], answer["configured"]) == ("edf", 2.5, True)
        # what the CLI set is what the API serves
        api = httpx.get(f"{url}/v1/namespaces/team-q/queue", headers=ADMIN_H).json()
        assert api["discipline"] == "edf" and api["weight"] == 2.5

        r = _run(["queues", "set", "--discipline", "fair-share", "--half-life", "600"], url)
        assert r.returncode == 0, r.stderr
        assert "discipline fair-share" in r.stdout and "half-life 600s" in r.stdout
        assert "team-q  discipline edf  weight 2.5" in r.stdout

        r = _run(["queues", "get", "team-q"], url)
        assert r.returncode == 0 and "team-q  discipline edf  weight 2.5" in r.stdout and "dominant share" in r.stdout
        cluster = json.loads(_run(["queues", "get", "--json"], url).stdout)
        assert cluster["discipline"] == "fair-share" and cluster["halfLifeSeconds"] == 600
        assert cluster["namespaces"]["team-q"] == {"discipline": "edf", "weight": 2.5}

        # bad input: one line on stderr, exit 2, nothing changed
        for args, needle in [
            (["queues", "set", "team-q", "--discipline", "lifo"], "discipline"),
            (["queues", "set", "team-q"], "nothing to set"),
            (["queues", "set", "--weight", "3"], "belongs to a namespace"),
            (["queues", "set", "team-q", "--half-life", "5"], "cluster setting"),
        ]:
            bad = _run(args, url)
            assert bad.returncode == 2 and needle in bad.stderr, (args, bad.stderr)
            assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
        assert httpx.get(f"{url}/v1/namespaces/team-q/queue", headers=ADMIN_H).json()["discipline"] == "edf"

        missing = _run(["queues", "get", "no-such-ns"], url)
        assert missing.returncode == 1 and "404" in missing.stderr
