"""RSS of a broker process after N finished jobs with large specs (issue 17: memory stays bounded).

Usage: .venv/bin/python bench/finished_jobs_rss.py [--jobs 10000] [--spec-kib 100] [--store sqlite|URL]

An app on a fresh SQLite file (or the given PostgreSQL URL) with a dry-run ``aws`` on a manual clock: N jobs,
each carrying a spec of about ``--spec-kib`` KiB (an env value), are submitted in batches of 500 and driven
to SUCCEEDED by scheduler cycles (the clock jumps past each job's duration). Prints the RSS before the
first job and after the last, and the spec cache's size. Last line:
``finished_jobs_rss jobs=<n> spec_kib=<k> rss_start_mib=<x> rss_end_mib=<x> growth_mib=<x> cache_entries=<n>``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def run(jobs: int, spec_kib: int, store: str | None = None) -> dict[str, float]:
    import pricing
    from broker.clock import ManualClock
    from broker.lifecycle import submit_jobs
    from broker.spec import parse_job_spec
    from providers.dryrun import DryRunProvider
    from providers.onprem import OnPremPool
    from tests.broker.service_support import job_doc, make_app, write_inventory

    tmp = Path(tempfile.mkdtemp(prefix="hb-rss-"))
    clock = ManualClock()
    url = store or f"sqlite:///{tmp / 'broker.db'}"
    inventory = pricing.load_inventory(write_inventory(tmp))
    providers = {"onprem": OnPremPool(inventory, tmp / "data", clock=clock), "aws": DryRunProvider("aws", clock=clock)}
    app = make_app(tmp, url, providers=providers, clock=clock)
    hb = app.state.hb
    blob = "x" * (spec_kib * 1024)

    def batch(start: int, n: int) -> None:
        docs = [job_doc(f"big-{start + i}", providers=["aws"], env={"BLOB": blob}, hours=0.01) for i in range(n)]
        specs = [parse_job_spec(d, now=clock.now()) for d in docs]
        with hb.store.tx() as session:
            submit_jobs(session, "default", specs, now=clock.now(), spec_docs=[json.dumps(s.raw) for s in specs])

    # warm up: one small round, so imports and caches are in before the baseline
    batch(0, 20)
    for _ in range(4):
        hb.scheduler.run_cycle()
        clock.advance(3600)
    gc.collect()
    start = rss_mib()
    done = 20
    while done < jobs + 20:
        n = min(500, jobs + 20 - done)
        batch(done, n)
        done += n
        for _ in range(3):
            hb.scheduler.run_cycle()
            clock.advance(3600)
    for _ in range(3):
        hb.scheduler.run_cycle()
        clock.advance(3600)
    gc.collect()
    end = rss_mib()
    hb.store.dispose()
    return {"rss_start_mib": start, "rss_end_mib": end, "growth_mib": end - start,
            "cache_entries": float(len(hb.scheduler._spec_cache))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--spec-kib", type=int, default=100)
    ap.add_argument("--store", default=None)
    args = ap.parse_args()
    got = run(args.jobs, args.spec_kib, args.store)
    print(f"finished_jobs_rss jobs={args.jobs} spec_kib={args.spec_kib} rss_start_mib={got['rss_start_mib']:.1f} "
          f"rss_end_mib={got['rss_end_mib']:.1f} growth_mib={got['growth_mib']:.1f} "
          f"cache_entries={got['cache_entries']:.0f}")


if __name__ == "__main__":
    main()
