"""Placement latency over the full catalog (embedded + ../shared SkyPilot v8), and catalog load time.

Usage: .venv/bin/python bench/placement.py [--catalog DIR] [--requests 1000] [--batch 10000] [--seed 42]

Prints: catalog size; cold load (no parse cache: Libcloud JSON + CSVs parsed) and warm load (the .npz
cache, what every later process start does); per-placement latency over N varied requests (median, p90,
p99, max); a batch of M varied requests end to end. Last line:
``placement median_ms=<x> p99_ms=<x> batch10k_s=<x> load_s=<x>`` where load_s is the cold load.
The parse cache goes to a temporary directory that is removed at the end; nothing touches the network.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.model import DataInput, Objective, Request, SpotPolicy  # noqa: E402
from policies.placement import place  # noqa: E402
from pricing import Catalog, load_catalog, load_egress  # noqa: E402

DEFAULT_CATALOG = Path(__file__).resolve().parents[2] / "shared" / "catalogs" / "skypilot" / "v8"
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def varied_requests(cat: Catalog, n: int, seed: int) -> list[Request]:
    """``n`` deterministic, varied requests: CPU and GPU shapes, spot policies, allow-lists, data inputs in
    random catalog regions (30%), deadlines (15%), price caps (20%), the time objective (20%), gangs."""
    rng = random.Random(seed)
    clouds = [loc.key for loc in cat.locations if loc.provider in ("aws", "azure", "gcp")]
    regions = sorted({loc.region for loc in cat.locations})
    gpu_kinds = ["T4", "A100", "L4", "A10G", "V100", "H100", "A100-80GB"]
    out = []
    for i in range(n):
        vcpus = rng.choice([1, 2, 4, 8, 16, 32, 64])
        mem = vcpus * rng.choice([1, 2, 4, 8])
        acc, gpus = None, 0
        if rng.random() < 0.25:
            acc, gpus = rng.choice(gpu_kinds), rng.choice([1, 1, 2, 4, 8])
            vcpus, mem = min(vcpus, 8), min(mem, 32)
        data: tuple[DataInput, ...] = ()
        if rng.random() < 0.3:
            data = tuple(
                DataInput(f"s3://b/{i}/{k}", rng.choice(clouds), rng.choice([1, 10, 100, 500, 2000, 5000]))
                for k in range(rng.choice([1, 1, 2]))
            )
        providers = rng.choice([(), (), ("aws",), ("gcp", "azure"), ("aws", "gcp")])
        regs = tuple(rng.sample(regions, 3)) if rng.random() < 0.1 else ()
        out.append(Request(
            name=f"r{i}", vcpus=vcpus, memory_gib=mem, gpus=gpus, accelerator=acc,
            arch=rng.choice(["amd64", "amd64", "amd64", "any", "arm64"]),
            duration_hours=rng.choice([0.5, 1, 3, 12]),
            deadline=NOW + timedelta(hours=rng.choice([2, 6, 48])) if rng.random() < 0.15 else None,
            data=data, providers=providers, regions=regs,
            spot=rng.choice(list(SpotPolicy)),
            max_hourly_usd=rng.choice([0.5, 5.0, 40.0]) if rng.random() < 0.2 else None,
            objective=Objective.TIME if rng.random() < 0.2 else Objective.COST,
            nodes=rng.choice([1, 1, 1, 2, 4]),
        ))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog", type=Path, default=DEFAULT_CATALOG)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    if not (args.catalog / "gcp" / "vms.csv").is_file():
        print(f"catalog {args.catalog} not found; pass --catalog DIR", file=sys.stderr)
        raise SystemExit(2)
    tmp = tempfile.mkdtemp(prefix="hb-bench-")
    os.environ["BROKER_DATA_DIR"] = tmp
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        cat = load_catalog(args.catalog)
        cold_s, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
        warm = []
        for _ in range(5):
            t0 = time.perf_counter()
            load_catalog(args.catalog)
            warm.append(time.perf_counter() - t0)
        warm_s = statistics.median(warm)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    egress = load_egress()
    print(f"catalog {cat.version}: {len(cat)} offers, {len(cat.locations)} locations")
    print(f"load: cold (parse, no cache) {cold_s:.3f} s wall, {cold_cpu:.3f} s CPU; "
          f"warm (.npz cache) {warm_s * 1e3:.1f} ms (median of 5)")

    reqs = varied_requests(cat, args.requests, args.seed)
    for r in reqs[:20]:  # warm-up: per-source egress route tables, numpy code paths
        place(r, cat, egress, now=NOW)
    lat = []
    placed = 0
    for r in reqs:
        t0 = time.perf_counter()
        res = place(r, cat, egress, now=NOW)
        lat.append((time.perf_counter() - t0) * 1e3)
        placed += res.placement is not None
    lat.sort()
    med, p90 = statistics.median(lat), lat[int(0.90 * len(lat)) - 1]
    p99, worst = lat[int(0.99 * len(lat)) - 1], lat[-1]
    print(f"{args.requests} varied requests: median {med:.3f} ms, p90 {p90:.3f} ms, p99 {p99:.3f} ms, "
          f"max {worst:.3f} ms; {placed} placed, {args.requests - placed} infeasible")

    batch = varied_requests(cat, args.batch, args.seed + 1)
    t0, c0 = time.perf_counter(), time.process_time()
    placed = sum(place(r, cat, egress, now=NOW).placement is not None for r in batch)
    batch_s, batch_cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"{args.batch} varied requests end to end: {batch_s:.2f} s wall, {batch_cpu:.2f} s CPU "
          f"({args.batch / batch_s:.0f}/s); {placed} placed")
    # What recording a decision adds (issue 12): place(..., baselines=True) also prices the report's savings
    # baselines (best on-demand, compute-only plan, best per region). Same requests, same process, CPU time.
    few = reqs[: min(200, len(reqs))]
    c0 = time.process_time()
    for r in few:
        place(r, cat, egress, now=NOW)
    plain_cpu = time.process_time() - c0
    c0 = time.process_time()
    for r in few:
        place(r, cat, egress, now=NOW, baselines=True)
    base_cpu = time.process_time() - c0
    print(f"{len(few)} requests with baselines: {base_cpu / len(few) * 1e3:.3f} ms CPU each vs "
          f"{plain_cpu / len(few) * 1e3:.3f} ms without (ratio {base_cpu / max(plain_cpu, 1e-9):.2f}x)")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} (shared; wall > CPU under load)")
    print(f"placement median_ms={med:.3f} p99_ms={p99:.3f} batch10k_s={batch_s:.2f} load_s={cold_s:.3f}")


if __name__ == "__main__":
    main()
