#!/usr/bin/env python3
"""Batch placement under capacity: the fast heuristic against HiGHS's exact optimum.

Instances are generated over the real catalog (the embedded one plus ``../shared/catalogs/skypilot/v8``
when present): ~60 request shapes (CPU batch, memory-heavy, T4/L4/A10G/A100/V100 GPU jobs, spot allowed
or not, data inputs in different regions) are placed once each with ``policies.placement.place(top=8)``;
each job takes a random shape and a duration factor that scales its candidates' costs, plus an on-prem
candidate (three racks of owned hosts, cheap but small) when it needs no GPU. Capacity limits: each job's
demand is spread evenly over the pools of its candidates and every ``provider:region`` pool gets a vCPU and
GPU quota of 1.2 x its share (at least 32 vCPU / 8 GPU and the largest job; the racks 0.8 x, no GPU). In
total there is room for nearly everyone, but not where everyone's cheapest option is, so the solvers must
decide who goes where.

Prints, per size: heuristic seconds (median of 3 runs) and cost, HiGHS seconds, status, cost and gap,
and the heuristic's excess over HiGHS. HiGHS runs single-threaded with a 60 s limit.

    .venv/bin/python bench/batch_placement.py [--sizes 100,1000,2000,10000] [--seed 1] [--time-limit 60]
        [--markdown docs/benchmarks/policies.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.model import DataInput, Request, SpotPolicy  # noqa: E402
from policies.batch import (  # noqa: E402
    BatchJob,
    Candidate,
    PoolCapacity,
    candidates_from_options,
    evaluate,
    gap,
    solve_exact,
    solve_heuristic,
)

DATA_REGIONS = ("aws:us-east-1", "aws:eu-west-1", "gcp:us-central1", "azure:westeurope", "aws:ap-southeast-1")
GPU_SHAPES = (("T4", 1, 8, 32), ("L4", 1, 8, 32), ("A10G", 1, 8, 32), ("V100", 1, 8, 61), ("A100", 1, 12, 85),
              ("A100", 8, 96, 680), ("T4", 4, 48, 192))
RACKS = ("onprem:rack-a", "onprem:rack-b", "onprem:rack-c")


def shapes(catalog: object, egress: object, rng: random.Random) -> list[tuple[str, tuple[Candidate, ...], bool]]:
    from policies.placement import place

    requests: list[Request] = []
    for i in range(60):
        data = (DataInput(f"s3://bench/{i}", rng.choice(DATA_REGIONS), rng.choice([0, 5, 50, 200])),)
        spot = rng.choice([SpotPolicy.NEVER, SpotPolicy.ALLOWED])
        if i % 3 == 0:
            acc, gpus, cpu, mem = rng.choice(GPU_SHAPES)
            requests.append(Request(f"gpu-{i}", vcpus=cpu, memory_gib=mem, gpus=gpus, accelerator=acc,
                                    duration_hours=rng.choice([1, 2, 4]), data=data, spot=spot))
        else:
            cpu = rng.choice([2, 4, 8, 16, 32])
            mem = cpu * rng.choice([2, 4, 8])
            requests.append(Request(f"cpu-{i}", vcpus=cpu, memory_gib=mem, duration_hours=rng.choice([1, 2, 4, 8]),
                                    data=data, spot=spot))
    out = []
    for r in requests:
        res = place(r, catalog, egress, top=8)  # type: ignore[arg-type]
        options = [o for o in [res.placement, *res.alternatives] if o is not None]
        if options:
            out.append((r.name, candidates_from_options(options), r.gpus > 0))
    return out


def instance(n: int, shape_list: list, rng: random.Random) -> tuple[list[BatchJob], dict[str, PoolCapacity]]:
    jobs: list[BatchJob] = []
    for j in range(n):
        name, cands, has_gpu = rng.choice(shape_list)
        factor = rng.uniform(0.5, 3.0)
        scaled = [Candidate(c.pool, c.cost_usd * factor, c.vcpus, c.gpus, c.label) for c in cands]
        if not has_gpu:
            cpu = cands[0].vcpus
            rack = rng.choice(RACKS)
            scaled.append(Candidate(rack, 0.01 * cpu * factor * 2, cpu, 0.0, f"{rack}:owned"))
        jobs.append(BatchJob(f"{name}-{j}", tuple(scaled)))
    # each job's demand spread evenly over the pools of its candidates; a pool gets 1.2 x that share,
    # so in total there is room for everyone, but not where everyone's cheapest option is
    share_cpu: dict[str, float] = {}
    share_gpu: dict[str, float] = {}
    for job in jobs:
        pools_of = {c.pool for c in job.candidates}
        for c in job.candidates:
            if c.pool in pools_of:
                pools_of.discard(c.pool)
                k = len({x.pool for x in job.candidates})
                share_cpu[c.pool] = share_cpu.get(c.pool, 0.0) + c.vcpus / k
                share_gpu[c.pool] = share_gpu.get(c.pool, 0.0) + c.gpus / k
    biggest_cpu: dict[str, float] = {}
    biggest_gpu: dict[str, float] = {}
    for job in jobs:
        for c in job.candidates:
            biggest_cpu[c.pool] = max(biggest_cpu.get(c.pool, 0.0), c.vcpus)
            biggest_gpu[c.pool] = max(biggest_gpu.get(c.pool, 0.0), c.gpus)
    capacity = {}
    for p in sorted(share_cpu):
        floor_cpu = max(32.0, biggest_cpu[p])
        if p in RACKS:
            capacity[p] = PoolCapacity(max(floor_cpu, round(0.8 * share_cpu[p])), 0.0)
        else:
            capacity[p] = PoolCapacity(max(floor_cpu, round(1.2 * share_cpu[p])),
                                       max(8.0, biggest_gpu[p], round(1.2 * share_gpu[p])))
    return jobs, capacity


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,2000,10000")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--catalog", default=str(ROOT.parent / "shared" / "catalogs" / "skypilot" / "v8"))
    parser.add_argument("--markdown", default=None, help="also write the figures as a markdown table here")
    args = parser.parse_args(argv)

    import pricing

    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    catalog_dir = Path(args.catalog) if Path(args.catalog).is_dir() else None
    catalog = pricing.load_catalog(catalog_dir)
    egress = pricing.load_egress(None)
    shape_list = shapes(catalog, egress, rng)
    print(f"catalog: {len(catalog)} offers ({'embedded + ' + str(catalog_dir) if catalog_dir else 'embedded only'}); "
          f"{len(shape_list)} request shapes placed in {time.perf_counter() - t0:.1f} s")
    header = ("| jobs | candidates | pools | heuristic | heuristic s | heuristic $ | unplaced | proven gap (LP bound) "
              "| HiGHS s | HiGHS status | HiGHS $ | HiGHS gap | heuristic vs HiGHS |")
    rows = [header, "|" + "---|" * 13]
    print(header)
    worst = 0.0
    heur_10k = None
    for n in (int(s) for s in args.sizes.split(",")):
        jobs, capacity = instance(n, shape_list, rng)
        runs = [solve_heuristic(jobs, capacity) for _ in range(3)]  # deterministic; median time of 3
        heur = sorted(runs, key=lambda r: r.seconds)[1]
        assert not evaluate(jobs, capacity, heur.assignment), "heuristic broke a capacity limit"
        if n >= 10000:
            heur_10k = heur.seconds
        try:
            exact = solve_exact(jobs, capacity, time_limit_seconds=args.time_limit)
            assert not evaluate(jobs, capacity, exact.assignment)
            excess = gap(heur, exact)
            cells = [f"{exact.seconds:.2f}", exact.status, f"{exact.objective_usd:,.2f}",
                     f"{100 * (exact.gap or 0):.3f} %", f"{100 * excess:+.3f} %"]
            if exact.status == "optimal":
                worst = max(worst, excess)
        except RuntimeError as exc:
            cells = ["-", f"no solution ({exc})", "-", "-", "-"]
        ncand = sum(len(j.candidates) for j in jobs)
        proven = "-" if heur.gap is None else f"{100 * heur.gap:.3f} %"
        row = (f"| {n:,} | {ncand:,} | {len(capacity)} | {heur.method} | {heur.seconds:.3f} | "
               f"{heur.objective_usd:,.2f} | {len(heur.unplaced)} | {proven} | " + " | ".join(cells) + " |")
        rows.append(row)
        print(row, flush=True)
    summary = (f"summary: heuristic within {100 * worst:.3f} % of HiGHS's optimum where HiGHS proved optimality; "
               f"10,000 jobs placed by the heuristic in {heur_10k:.2f} s" if heur_10k is not None else
               f"summary: heuristic within {100 * worst:.3f} % of HiGHS's optimum where HiGHS proved optimality")
    if args.markdown:
        cmd = ".venv/bin/python bench/batch_placement.py " + " ".join(argv if argv is not None else sys.argv[1:])
        text = [
            "# Benchmarks: scheduling policies (batch placement under capacity)", "",
            f"Command: `{cmd.strip()}`  ", f"Machine: {platform.machine()}, {os.cpu_count()} cores "
            f"(shared with other work), Python {platform.python_version()}, HiGHS single-threaded, "
            f"{args.time_limit:g} s limit.", "", *rows, "", summary, "",
        ]
        Path(args.markdown).write_text("\n".join(text))
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
