"""Submission throughput of the broker's HTTP API on loopback: single jobs and bursts of 100.

Starts a real ``broker serve`` subprocess (scheduler idle) on a free port with a fresh store
(SQLite in a temp dir, or ``--database-url`` for PostgreSQL), then runs N concurrent keep-alive clients for a
bounded number of requests and prints jobs/s with p50/p99 request latency, and the server's own CPU time
per request (from /proc, so the figure does not depend on the load generator). Ends with one summary line.

The load generator shares the machine's 2 cores with the server, so its own cost matters:

* ``--client http`` (default): one stdlib ``http.client`` keep-alive connection per client thread (cheap).
* ``--client httpx``: one keep-alive ``httpx.Client`` per thread (what the ``broker`` CLI uses; ~3x the
  client CPU per request, which on 2 cores takes throughput away from the server).
* ``--wrk``: also run ``wrk`` (C, Debian package ``wrk``) posting the same single job for ``--wrk-seconds``
  with 8 connections, when it is installed.

    .venv/bin/python bench/api.py [--client http|httpx] [--wrk]
        [--database-url postgresql+psycopg://postgres@127.0.0.1:5432/DB]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.broker.service_support import ADMIN_H, free_port, job_doc, write_inventory  # noqa: E402

SERVE = [sys.executable, "-c", "import sys; from broker.cli import main; main(sys.argv[1:])", "serve"]
PATH = "/v1/namespaces/default/jobs"


@contextlib.contextmanager
def broker_serve(tmp: Path, database_url: str) -> Iterator[tuple[str, int]]:
    """A ``broker serve`` subprocess on a free port; yields its base URL and pid; SIGTERM at the end."""
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
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc; 0 when unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _httpx_poster(url: str, body: bytes) -> tuple[Callable[[], int], Callable[[], None]]:
    http = httpx.Client(base_url=url, headers=ADMIN_H | {"Content-Type": "application/json"}, timeout=30)
    return (lambda: http.post(PATH, content=body).status_code), http.close


def _stdlib_poster(url: str, body: bytes) -> tuple[Callable[[], int], Callable[[], None]]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    headers = ADMIN_H | {"Content-Type": "application/json"}

    def post() -> int:
        conn.request("POST", PATH, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status

    return post, conn.close


CLIENTS = {"http": _stdlib_poster, "httpx": _httpx_poster}


def run(url: str, *, requests: int, per_request: int, clients: int, client: str = "http") -> tuple[float, list[float]]:
    """``requests`` POSTs of ``per_request`` jobs from ``clients`` threads; (seconds, latencies)."""
    docs = [job_doc(f"bench-{i}") for i in range(per_request)]
    body = json.dumps(docs[0] if per_request == 1 else docs).encode()
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def worker() -> None:
        post, close = CLIENTS[client](url, body)
        mine = []
        try:
            for _ in iter(lambda: next(counter, None), None):
                t0 = time.perf_counter()
                status = post()
                mine.append(time.perf_counter() - t0)
                if status != 201:
                    errors.append(f"HTTP {status}")
                    return
        finally:
            close()
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"bench: the server answered {errors[0]} to a submission")
    return time.perf_counter() - t0, latencies


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def run_wrk(url: str, tmp: Path, seconds: int, connections: int) -> tuple[float, float, float] | None:
    """``wrk`` posting one job per request; (requests/s, p50 ms, p99 ms), or None without wrk."""
    exe = shutil.which("wrk")
    if exe is None:
        return None
    script = tmp / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(json.dumps(job_doc('bench-wrk')))}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "{ADMIN_H["Authorization"]}"\n'
    )
    out = subprocess.run(
        [exe, "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url + PATH],
        capture_output=True, text=True, timeout=seconds + 60, check=True,
    ).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"bench: wrk saw errors:\n{out}")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    return rate, p50, p99


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default="")
    parser.add_argument("--singles", type=int, default=3000)
    parser.add_argument("--bursts", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--client", choices=sorted(CLIENTS), default="http")
    parser.add_argument("--wrk", action="store_true", help="also measure single submissions with wrk")
    parser.add_argument("--wrk-seconds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url_db = args.database_url or f"sqlite:///{tmp}/bench.db"
        kind = "postgresql" if url_db.startswith("postgresql") else "sqlite"
        with broker_serve(Path(tmp), url_db) as (url, pid):
            run(url, requests=200, per_request=1, clients=args.clients, client=args.client)  # warm-up
            cpu0 = cpu_seconds(pid)
            took, lat = run(url, requests=args.singles, per_request=1, clients=args.clients, client=args.client)
            server_ms = (cpu_seconds(pid) - cpu0) / args.singles * 1000
            single = args.singles / took
            print(f"[{kind}] single submissions ({args.client} client): {args.singles} in {took:.2f}s = "
                  f"{single:.0f} jobs/s; p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms "
                  f"({args.clients} clients); server CPU {server_ms:.2f} ms/request")
            wrk = run_wrk(url, Path(tmp), args.wrk_seconds, args.clients) if args.wrk else None
            if wrk is not None:
                print(f"[{kind}] single submissions (wrk, {args.clients} connections, {args.wrk_seconds}s): "
                      f"{wrk[0]:.0f} jobs/s; p50 {wrk[1]:.1f} ms, p99 {wrk[2]:.1f} ms")
            elif args.wrk:
                print(f"[{kind}] wrk not installed (apt-get install -y wrk): skipped")
            took, lat = run(url, requests=args.bursts, per_request=100, clients=args.clients, client=args.client)
            burst = args.bursts * 100 / took
            print(f"[{kind}] bursts of 100 ({args.client} client): {args.bursts} in {took:.2f}s = {burst:.0f} jobs/s; "
                  f"p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms per burst")
    extra = f", wrk {wrk[0]:.0f} jobs/s" if wrk is not None else ""
    print(f"SUMMARY api[{kind}]: single {single:.0f} jobs/s ({args.client} client{extra}; target 500), "
          f"bursts {burst:.0f} jobs/s (target 5000)")


if __name__ == "__main__":
    main()
