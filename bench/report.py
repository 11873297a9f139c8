"""Benchmark: placement reports over 100,000 decision records (issue 7: render in < 10 s).

Fills a SQLite store (a temp dir) with N realistic decision records (bulk Core insert), then times
each step of a report: load the records, build the report, render HTML (5 matplotlib SVG charts),
CSV and JSON. Baseline in the same process: the same report over 1,000 records.

    .venv/bin/python bench/report.py [--records 100000]

Wall times per step, the end-to-end time of each format (load + build + render: ``total_html_s``,
``total_csv_s``, ``total_json_s``; the decisions are built while rendering CSV/JSON, so only the
totals compare across versions), and the process CPU time of load+build+html (``cpu_html_s``: fairer
on a shared machine). Last line: ``report records=<n> load_s= build_s= html_s= csv_s= json_s=
total_html_s= total_csv_s= total_json_s= cpu_html_s=``.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine, insert  # noqa: E402
from sqlmodel import SQLModel  # noqa: E402

from broker.decisions import DecisionRecord, option_to_dict, request_to_dict  # noqa: E402
from broker.model import DataInput, PlacementOption, Request, SpotPolicy  # noqa: E402
from broker.reports import build_report, render_csv, render_html, render_json  # noqa: E402
from broker.reports.store import load_records  # noqa: E402

REGIONS = [  # (provider, region, on-demand $/vCPU-h, egress $/GiB out)
    ("aws", "us-east-1", 0.048, 0.09), ("aws", "us-west-2", 0.048, 0.09), ("aws", "eu-west-1", 0.053, 0.09),
    ("aws", "ap-southeast-1", 0.06, 0.12), ("azure", "eastus", 0.048, 0.087), ("azure", "westeurope", 0.055, 0.087),
    ("azure", "northeurope", 0.052, 0.087), ("gcp", "us-central1", 0.047, 0.12), ("gcp", "europe-west4", 0.052, 0.12),
    ("gcp", "asia-east1", 0.055, 0.12),
]
SHAPES = [(2, 8, "m6i.large"), (8, 32, "m6i.2xlarge"), (16, 64, "m6i.4xlarge"), (32, 128, "m6i.8xlarge")]


def rows(n: int, seed: int = 1) -> list[dict[str, object]]:
    rng = random.Random(seed)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    out: list[dict[str, object]] = []
    for i in range(n):
        vcpus, mem, itype = rng.choice(SHAPES)
        hours = rng.choice([0.25, 1, 2, 4, 8, 24])
        src = rng.choice(REGIONS)
        gib = rng.choice([0, 0, 5, 50, 500, 2000])
        spot = rng.choice([SpotPolicy.NEVER, SpotPolicy.ALLOWED])
        at = t0 + timedelta(seconds=26 * i)
        deadline = at + timedelta(hours=hours * rng.choice([1.5, 3, 10])) if rng.random() < 0.25 else None
        req = Request(f"job-{i}", vcpus, mem, duration_hours=hours, deadline=deadline, spot=spot,
                      data=(DataInput(f"s3://d/{i}", f"{src[0]}:{src[1]}", float(gib)),) if gib else ())
        opts = []
        for p, r, per_vcpu, _e in rng.sample(REGIONS, 6):
            cap = "spot" if spot == SpotPolicy.ALLOWED and rng.random() < 0.6 else "on-demand"
            hourly = vcpus * per_vcpu * rng.uniform(0.95, 1.1) * (0.32 if cap == "spot" else 1.0)
            local = (p, r) == src[:2]
            transfer = 0.0 if local or not gib else gib * 8 / 3600 / 5
            egress = 0.0 if local else gib * src[3]
            compute = hourly * (hours + transfer)
            opts.append(PlacementOption(p, r, None, itype, cap, vcpus, mem, 0, None, hourly, compute, egress, transfer,
                                        compute + egress, "cloud", hours + transfer))
        opts.sort(key=lambda o: o.total_usd)
        best = opts[0]
        finished = rng.random() < 0.6
        runtime = hours * rng.uniform(0.8, 1.3)
        out.append({
            "job_id": f"j{i}", "namespace": rng.choice(["team-a", "team-b", "ml", "etl"]), "kind": "placement",
            "job_name": req.name, "created_at": at, "request": request_to_dict(req),
            "chosen": option_to_dict(best), "alternatives": [option_to_dict(o) for o in opts[:5]],
            "rejected": {"InsufficientVCPUs": rng.randint(0, 50000), "DeadlineMiss": rng.randint(0, 30)},
            "constraints": {"spot": spot.value}, "considered": 90000, "feasible": rng.randint(10, 9000),
            "policy": "cost", "catalog_version": f"2026-01-0{1 + i % 3}-abc", "explanation": "",
            "provider": best.provider, "region": best.region, "capacity": best.capacity, "total_usd": best.total_usd,
            "nodes": 1, "deadline": deadline, "predicted_finish_at": at + timedelta(hours=best.finish_hours),
            "runtime_hours": runtime if finished else None,
            "actual_cost_usd": best.hourly_usd * runtime + best.egress_usd if finished else None,
            "finished_at": at + timedelta(hours=runtime) if finished else None,
            "deadline_met": (at + timedelta(hours=runtime) <= deadline) if finished and deadline else None,
        })
    return out


def run(n: int, tmp: Path) -> dict[str, float]:
    engine = create_engine(f"sqlite:///{tmp}/bench-{n}.db")
    table = DecisionRecord.__table__  # type: ignore[attr-defined]
    SQLModel.metadata.create_all(engine, tables=[table])
    data = rows(n)
    t = time.perf_counter()
    with engine.begin() as conn:
        for k in range(0, n, 10_000):
            conn.execute(insert(table), data[k : k + 10_000])
    fill_s = time.perf_counter() - t
    del data
    times = {"fill_s": fill_s}
    c0, t = time.process_time(), time.perf_counter()
    with engine.connect() as conn:
        recs = load_records(conn)
    times["load_s"] = time.perf_counter() - t
    t = time.perf_counter()
    report = build_report(recs)
    times["build_s"] = time.perf_counter() - t
    t = time.perf_counter()
    render_html(report)
    times["html_s"] = time.perf_counter() - t
    times["cpu_html_s"] = time.process_time() - c0
    for name, fn in (("csv_s", render_csv), ("json_s", render_json)):
        t = time.perf_counter()
        fn(report)
        times[name] = time.perf_counter() - t
    engine.dispose()
    for fmt in ("html", "csv", "json"):
        times[f"total_{fmt}_s"] = times["load_s"] + times["build_s"] + times[f"{fmt}_s"]
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    args = ap.parse_args()
    import matplotlib  # warm the import so neither run pays it

    matplotlib.use("Agg")
    with tempfile.TemporaryDirectory(prefix="hb-bench-report-") as d:
        base = run(1_000, Path(d))
        big = run(args.records, Path(d))
    print(f"{'step':<14}{'1,000 rec':>12}{f'{args.records:,} rec':>14}")
    for k in ("fill_s", "load_s", "build_s", "html_s", "csv_s", "json_s", "total_html_s", "total_csv_s",
              "total_json_s", "cpu_html_s"):
        print(f"{k:<14}{base[k]:>12.3f}{big[k]:>14.3f}")
    ratio = big["total_html_s"] / base["total_html_s"] if base["total_html_s"] else float("nan")
    print(f"html report end to end: {big['total_html_s']:.2f} s for {args.records:,} records "
          f"({ratio:.1f}x the 1,000-record time; target < 10 s)")
    print(
        f"report records={args.records} load_s={big['load_s']:.2f} build_s={big['build_s']:.2f} "
        f"html_s={big['html_s']:.2f} csv_s={big['csv_s']:.2f} json_s={big['json_s']:.2f} "
        f"total_html_s={big['total_html_s']:.2f} total_csv_s={big['total_csv_s']:.2f} "
        f"total_json_s={big['total_json_s']:.2f} cpu_html_s={big['cpu_html_s']:.2f}"
    )


if __name__ == "__main__":
    main()
