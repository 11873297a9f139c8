"""Scheduler throughput: placing and dispatching N pending jobs to a provider that accepts instantly
(FakeProvider), through the real cycle (heads, snapshot, admit, place over the embedded catalog with a
decision record per job, provision via failover, poll, requeue). Ends with one summary line.

    .venv/bin/python bench/scheduler.py [--jobs 4000] [--database-url postgresql+psycopg://...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.lifecycle import submit_jobs  # noqa: E402
from broker.spec import parse_job_spec  # noqa: E402
from providers.fake import FakeProvider  # noqa: E402
from tests.broker.service_support import job_doc, make_app  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{tmp}/bench.db"
        app = make_app(Path(tmp), url, providers={"aws": FakeProvider("aws")})
        hb = app.state.hb
        kind = "postgresql" if hb.store.is_postgres else "sqlite"
        now = hb.clock.now()
        specs = [parse_job_spec(job_doc(f"s-{i}", cpu=str(1 + i % 4), providers=["aws"]), now=now)
                 for i in range(args.jobs)]
        with hb.store.tx() as session:
            submit_jobs(session, "default", specs, now=now, spec_docs=[json.dumps(s.raw) for s in specs])
        cycles: list[float] = []
        steps: dict[str, float] = {}
        t0 = time.perf_counter()
        dispatched = 0
        while dispatched < args.jobs:
            c0 = time.perf_counter()
            report = hb.scheduler.run_cycle()
            cycles.append(time.perf_counter() - c0)
            dispatched += report.provisioned
            for k, v in report.step_seconds.items():
                steps[k] = steps.get(k, 0.0) + v
            if not report.heads:
                break
        took = time.perf_counter() - t0
        rate = dispatched / took
        print(f"[{kind}] {dispatched} jobs placed+dispatched in {took:.2f}s over {len(cycles)} cycles "
              f"= {rate:.0f} jobs/s; per-cycle p50 {sorted(cycles)[len(cycles) // 2] * 1000:.0f} ms, "
              f"max {max(cycles) * 1000:.0f} ms")
        print("  time by step: " + ", ".join(f"{k} {v:.2f}s" for k, v in steps.items()))
        hb.store.dispose()
    print(f"SUMMARY scheduler[{kind}]: {rate:.0f} jobs/s placed and dispatched (target 1000)")


if __name__ == "__main__":
    main()
