"""Issue 17, item 3: ``broker serve`` SIGKILLed again and again while it dispatches on-prem jobs never runs
a job twice (a real subprocess on SQLite; on-prem runs sandboxed as the namespace user when root)."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.broker.service_support import job_doc
from tests.broker.test_service_process import Server

H = {"Authorization": "Bearer hb_proc_admin"}


def _starts(data: Path) -> Counter[str]:
    """How many processes each job really started: runs whose command printed its first line."""
    out: Counter[str] = Counter()
    for run_json in (data / "runs").glob("*/run.json"):
        rec = json.loads(run_json.read_text())
        log = run_json.parent / "stdout.log"
        if log.exists() and log.read_text().startswith("started"):
            out[rec["tags"]["hb-job"]] += 1
    return out


@pytest.mark.slow
def test_sigkill_during_on_prem_dispatch_never_runs_a_job_twice(tmp_path: Path) -> None:
    server = Server(tmp_path, f"sqlite:///{tmp_path / 'broker.db'}")
    retry = {"backoffLimit": 5, "retryDelaySeconds": 0.1, "maxRetryDelaySeconds": 0.2}
    docs = [job_doc(f"d-{i}", cpu="100m", memory="64Mi", providers=["onprem"], retry=retry,
                    command=["sh", "-c", "echo started; sleep 1"]) for i in range(16)]
    try:
        server.start()
        r = httpx.post(f"{server.url}/v1/namespaces/default/jobs", json=docs, headers=H, timeout=30)
        assert r.status_code == 201, r.text
        ids = [j["id"] for j in r.json()["jobs"]]
        for delay in (0.15, 0.3):  # killed while the first cycles place and launch the burst
            time.sleep(delay)
            server.stop(signal.SIGKILL)
            server.start()
        deadline = time.monotonic() + 60
        while True:
            jobs = httpx.get(f"{server.url}/v1/namespaces/default/jobs", params={"limit": 100}, headers=H,
                             timeout=30).json()["jobs"]
            if all(j["state"] == "SUCCEEDED" for j in jobs) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert Counter(j["state"] for j in jobs) == {"SUCCEEDED": len(ids)}, jobs
        assert _starts(server.data) == Counter({i: 1 for i in ids}), "each job's command started exactly once"
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.ensure_dead()
