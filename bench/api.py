"""Submission throughput of the broker's HTTP API on loopback: single jobs and bursts of 100.

Starts a real ``broker serve`` subprocess (scheduler idle) on a free port with a fresh store
(SQLite in a temp dir, or ``--database-url`` for PostgreSQL), then runs N concurrent clients for a bounded
number of requests and prints jobs/s with p50/p99 request latency. Ends with one summary line.

    .venv/bin/python bench/api.py [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/DB]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.broker.service_support import ADMIN_H, free_port, job_doc, write_inventory  # noqa: E402

SERVE = [sys.executable, "-c", "import sys; from broker.cli import main; main(sys.argv[1:])", "serve"]


@contextlib.contextmanager
def broker_serve(tmp: Path, database_url: str) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")} | {
        "BROKER_DATABASE_URL": database_url, "BROKER_ADMIN_TOKEN": ADMIN_H["Authorization"].split()[1],
        "BROKER_INVENTORY": str(write_inventory(tmp)), "BROKER_SCHEDULER_INTERVAL_SECONDS": "3600",
        "BROKER_LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen(SERVE + ["--port", str(port), "--data-dir", str(tmp / "data")], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def run(url: str, *, requests: int, per_request: int, clients: int) -> tuple[float, list[float]]:
    docs = [job_doc(f"bench-{i}") for i in range(per_request)]
    body: object = docs[0] if per_request == 1 else docs
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def worker() -> None:
        with httpx.Client(base_url=url, headers=ADMIN_H, timeout=30) as http:
            mine = []
            for _ in iter(lambda: next(counter, None), None):
                t0 = time.perf_counter()
                r = http.post("/v1/namespaces/default/jobs", json=body)
                mine.append(time.perf_counter() - t0)
                assert r.status_code == 201, r.text
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, latencies


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default="")
    parser.add_argument("--singles", type=int, default=3000)
    parser.add_argument("--bursts", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url_db = args.database_url or f"sqlite:///{tmp}/bench.db"
        kind = "postgresql" if url_db.startswith("postgresql") else "sqlite"
        with broker_serve(Path(tmp), url_db) as url:
            run(url, requests=200, per_request=1, clients=args.clients)  # warm-up
            took, lat = run(url, requests=args.singles, per_request=1, clients=args.clients)
            single = args.singles / took
            print(f"[{kind}] single submissions: {args.singles} in {took:.2f}s = {single:.0f} jobs/s; "
                  f"p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms ({args.clients} clients)")
            took, lat = run(url, requests=args.bursts, per_request=100, clients=args.clients)
            burst = args.bursts * 100 / took
            print(f"[{kind}] bursts of 100: {args.bursts} in {took:.2f}s = {burst:.0f} jobs/s; "
                  f"p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms per burst")
    print(f"SUMMARY api[{kind}]: single {single:.0f} jobs/s (target 500), bursts {burst:.0f} jobs/s (target 5000)")


if __name__ == "__main__":
    main()
