"""``broker serve`` as a real subprocess: admin token once, clean SIGTERM, and no accepted job lost across
a SIGKILL in the middle of a 2,000-job burst (SQLite and PostgreSQL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.broker.service_support import free_port, job_doc, write_inventory

SERVE = [sys.executable, "-c", "import sys; from broker.cli import main; main(sys.argv[1:])", "serve"]


class Server:
    """A ``broker serve`` subprocess on a free port with the given store and data dir."""

    def __init__(self, tmp_path: Path, store_url: str, admin: str | None = "hb_proc_admin") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = tmp_path / "data"
        self.log = tmp_path / "server.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")} | {
            "BROKER_DATABASE_URL": store_url,
            "BROKER_INVENTORY": str(write_inventory(tmp_path)),
            "BROKER_PROVIDERS": "onprem,aws",
            "BROKER_SCHEDULER_INTERVAL_SECONDS": "0.1",
            "BROKER_DRY_RUN_SPEEDUP": "3600",
            "BROKER_LOG_LEVEL": "WARNING",
        }
        if admin:
            self.env["BROKER_ADMIN_TOKEN"] = admin
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._out = open(self.log, "ab")  # noqa: SIM115 - closed in wait/kill
        self.proc = subprocess.Popen(
            SERVE + ["--port", str(self.port), "--data-dir", str(self.data)],
            env=self.env, stdout=self._out, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(self.log.read_text())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self._out.close()
        return code

    def ensure_dead(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.mark.slow
def test_serve_prints_the_admin_token_once_and_stops_cleanly_on_sigterm(tmp_path: Path, store_url: str) -> None:
    server = Server(tmp_path, store_url, admin=None)
    try:
        server.start()
        assert server.stop(signal.SIGTERM) == 0
        text = server.log.read_text()
        assert text.count("admin token (shown once") == 1 and "broker: stopped" in text
        token = text.split("admin token (shown once, keep it): ")[1].split()[0]
        server.start()
        assert httpx.get(f"{server.url}/v1/whoami", headers={"Authorization": f"Bearer {token}"}).json()["admin"]
        assert server.stop(signal.SIGTERM) == 0
        assert server.log.read_text().count("admin token (shown once") == 1, "printed only at the first start"
    finally:
        server.ensure_dead()


@pytest.mark.slow
def test_no_accepted_job_is_lost_when_the_server_is_killed_mid_burst(tmp_path: Path, store_url: str) -> None:
    total, per_request = 2000, 20
    server = Server(tmp_path, store_url)
    headers = {"Authorization": "Bearer hb_proc_admin"}
    accepted: dict[int, list[str]] = {}
    progress = threading.Event()
    errors: list[str] = []

    def client() -> None:
        with httpx.Client(base_url=server.url, headers=headers, timeout=10) as http:
            for n in range(total // per_request):
                docs = [job_doc(f"k-{n * per_request + i}", providers=["aws"], hours=0.0005)
                        for i in range(per_request)]
                for _ in range(600):  # the idempotent client retries the same key until it gets an answer
                    try:
                        r = http.post("/v1/namespaces/default/jobs", json=docs, headers={"Idempotency-Key": f"b-{n}"})
                    except httpx.TransportError:
                        time.sleep(0.05)
                        continue
                    if r.status_code == 201:
                        accepted[n] = [j["id"] for j in r.json()["jobs"]]
                        break
                    errors.append(f"{r.status_code} {r.text[:200]}")
                    time.sleep(0.05)
                if len(accepted) >= 15:
                    progress.set()

    try:
        server.start()
        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        assert progress.wait(60), "the client made no progress"
        server.stop(signal.SIGKILL)
        server.start()
        thread.join(180)
        assert not thread.is_alive() and not errors, errors[:3]
        assert len(accepted) == total // per_request
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
            deadline = time.monotonic() + 120
            while True:
                jobs: list[dict[str, Any]] = []
                cursor = None
                while True:
                    page = http.get("/v1/namespaces/default/jobs",
                                    params={"limit": 1000} | ({"cursor": cursor} if cursor else {})).json()
                    jobs += page["jobs"]
                    cursor = page["next_cursor"]
                    if not cursor:
                        break
                if all(j["state"] == "SUCCEEDED" for j in jobs) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        names = Counter(j["name"] for j in jobs)
        assert len(jobs) == total and set(names.values()) == {1}, "every job exactly once"
        ids = {j["id"] for j in jobs}
        assert all(i in ids for batch in accepted.values() for i in batch), "every 2xx job exists"
        assert Counter(j["state"] for j in jobs) == {"SUCCEEDED": total}, "the scheduler resumed them all"
        assert server.stop(signal.SIGTERM) == 0
    finally:
        server.ensure_dead()
