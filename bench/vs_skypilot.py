"""hybrid-broker placement side by side with SkyPilot 0.14's optimizer, offline, on the same catalogs.

Usage: .venv/bin/python bench/vs_skypilot.py [--catalog DIR] [--sky-python .venv-sky/bin/python] [--reps 3]

SkyPilot pins many packages, so it lives in its own venv (``python -m venv .venv-sky &&
.venv-sky/bin/pip install 'skypilot==0.14.*'``, i.e. the ``bench`` extra). This script runs our half in the
current interpreter and re-executes itself under ``--sky-python`` with ``--sky-worker`` for SkyPilot's half;
the two exchange JSON over stdin/stdout. SkyPilot runs with a scratch ``SKY_RUNTIME_DIR``/``HOME`` holding a
copy of the catalogs (so it downloads nothing), usage collection off, and its cloud-credential checks
replaced by "AWS, GCP and Azure are enabled" (../shared/RECIPES.md section 9).

Both sides use only the SkyPilot v8 catalogs (our embedded Libcloud data is left out so the offer sets are
the same); both run each job for 1 hour (SkyPilot's default). For every task it prints both choices, both
$/h, SkyPilot's choice re-priced by our cost model (compute + egress of the task's input, which SkyPilot
cannot see because it never knows a bucket's region), our total, time per decision and the ratio.
Last line: ``vs_skypilot tasks=<n> speedup_median=<x> never_dearer=<yes|no>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CATALOG = ROOT.parent / "shared" / "catalogs" / "skypilot" / "v8"

# name, SkyPilot resources, our request (same meaning), input (location, GB) or None
TASKS: list[dict[str, Any]] = [
    {"name": "cpu-4-16", "cpus": "4+", "memory": "16+", "use_spot": False},
    {"name": "a100x8", "cpus": None, "memory": None, "accelerators": "A100:8", "use_spot": False},
    {"name": "t4-spot", "cpus": None, "memory": None, "accelerators": "T4:1", "use_spot": True},
    {"name": "aws-eu-west-1-only", "cpus": "8+", "memory": "32+", "use_spot": False, "infra": "aws/eu-west-1"},
    {"name": "500gb-in-aws-eu-west-1", "cpus": "8+", "memory": "32+", "use_spot": False,
     "input": ["s3://team-lake/events", "aws:eu-west-1", 500]},
    {"name": "a100-80gb-x8-spot", "cpus": None, "memory": None, "accelerators": "A100-80GB:8", "use_spot": True},
    {"name": "gcp-l4", "cpus": None, "memory": None, "accelerators": "L4:1", "use_spot": False, "infra": "gcp"},
]


# ----------------------------------------------------------------------------------------- SkyPilot half
def sky_worker(reps: int) -> None:
    """Runs under .venv-sky: reads TASKS JSON on stdin, prints SkyPilot's choices as JSON on stdout."""
    import logging

    logging.disable(logging.WARNING)
    import sky
    import sky.check

    clouds = [sky.clouds.AWS(), sky.clouds.GCP(), sky.clouds.Azure()]
    sky.check.get_cached_enabled_clouds_or_refresh = lambda *a, **k: clouds  # type: ignore[assignment]
    sky.check.check_capability = lambda *a, **k: None  # type: ignore[assignment]
    tasks = json.loads(sys.stdin.read())
    out = []
    for t in tasks:
        times = []
        best: Any = None
        for _ in range(reps):
            with sky.Dag() as dag:
                task = sky.Task(run="true")
                kw = {k: t[k] for k in ("cpus", "memory", "accelerators", "infra") if t.get(k)}
                task.set_resources(sky.Resources(use_spot=t["use_spot"], **kw))
                if t.get("input"):
                    task.set_inputs(t["input"][0], estimated_size_gigabytes=t["input"][2])
            t0 = time.perf_counter()
            sky.optimizer.Optimizer.optimize(dag, minimize=sky.OptimizeTarget.COST, quiet=True)
            times.append(time.perf_counter() - t0)
            best = task.best_resources
        out.append({
            "name": t["name"], "provider": str(best.cloud).lower(), "region": best.region, "zone": best.zone,
            "instance_type": best.instance_type, "spot": bool(best.use_spot),
            "hourly_usd": float(best.get_cost(3600)), "seconds": times,
            "accelerators": best.accelerators,
        })
    sys.stdout.write("\n@@HB-JSON@@" + json.dumps(out) + "\n")


def run_skypilot(sky_python: Path, catalog: Path, reps: int) -> list[dict[str, Any]]:
    scratch = Path(tempfile.mkdtemp(prefix="hb-sky-"))
    try:
        dst = scratch / ".sky" / "catalogs" / "v8"
        shutil.copytree(catalog, dst)  # a scratch copy for SkyPilot only; removed below
        env = {**os.environ, "SKY_RUNTIME_DIR": str(scratch), "HOME": str(scratch),
               "SKYPILOT_DISABLE_USAGE_COLLECTION": "1", "PYTHONWARNINGS": "ignore"}
        env.pop("PYTHONPATH", None)
        proc = subprocess.run(
            [str(sky_python), str(Path(__file__).resolve()), "--sky-worker", "--reps", str(reps)],
            input=json.dumps(TASKS), capture_output=True, text=True, env=env, timeout=900, cwd=str(scratch),
        )
        if proc.returncode != 0:
            raise SystemExit(f"SkyPilot worker failed:\n{proc.stderr[-3000:]}")
        marker = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@HB-JSON@@")]
        if not marker:
            raise SystemExit(f"SkyPilot worker printed no result:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        result: list[dict[str, Any]] = json.loads(marker[-1][len("@@HB-JSON@@"):])
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ----------------------------------------------------------------------------------------- our half
def our_request(t: dict[str, Any]) -> Any:
    from broker.model import DataInput, Request, SpotPolicy

    acc, gpus = None, 0
    if t.get("accelerators"):
        acc, n = t["accelerators"].split(":")
        gpus = int(n)
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    if t.get("infra"):
        parts = t["infra"].split("/")
        providers = (parts[0],)
        regions = tuple(parts[1:2])
    data: tuple[DataInput, ...] = ()
    if t.get("input"):
        uri, loc, gb = t["input"]
        data = (DataInput(uri, loc, gb * 1e9 / 2**30),)
    return Request(
        name=t["name"], vcpus=float((t.get("cpus") or "0").rstrip("+")),
        memory_gib=float((t.get("memory") or "0").rstrip("+")), gpus=gpus, accelerator=acc,
        duration_hours=1.0, data=data, providers=providers, regions=regions,
        spot=SpotPolicy.REQUIRED if t["use_spot"] else SpotPolicy.NEVER,
    )


def reprice(cat: Any, egress: Any, req: Any, s: dict[str, Any]) -> float | None:
    """SkyPilot's choice priced by our model (same offer row: hourly + egress of the inputs)."""
    from policies.placement.engine import price_offer

    rows = [
        i for i in cat.query(providers=[s["provider"]], regions=[s["region"]],
                             capacities=["spot" if s["spot"] else "on-demand"], include_outliers=True)
        if cat.type_names[int(cat.type_code[i])] == s["instance_type"]
        and (s["zone"] is None or cat.zones[int(cat.zone_code[i])] in ("", s["zone"]))
    ]
    if not rows:
        return None
    return float(price_offer(req, cat.offer(int(rows[0])), egress).total_usd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog", type=Path, default=DEFAULT_CATALOG)
    ap.add_argument("--sky-python", type=Path, default=ROOT / ".venv-sky" / "bin" / "python")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sky-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sky_worker:
        sky_worker(args.reps)
        return
    if not (args.catalog / "gcp" / "vms.csv").is_file():
        raise SystemExit(f"catalog {args.catalog} not found; pass --catalog DIR")
    if not args.sky_python.exists():
        raise SystemExit(f"{args.sky_python} not found. To fix: python -m venv .venv-sky && "
                         ".venv-sky/bin/pip install 'skypilot==0.14.*'")
    sys.path.insert(0, str(ROOT))
    from policies.placement import place
    from pricing import load_catalog, load_egress

    tmp = tempfile.mkdtemp(prefix="hb-bench-")
    os.environ["BROKER_DATA_DIR"] = tmp
    try:
        cat = load_catalog(args.catalog, include_embedded=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    egress = load_egress()
    print(f"catalog {cat.version}: {len(cat)} offers (SkyPilot v8 files only, same as SkyPilot reads)")
    t0 = time.perf_counter()
    theirs = {r["name"]: r for r in run_skypilot(args.sky_python, args.catalog, args.reps)}
    print(f"SkyPilot half: {time.perf_counter() - t0:.1f} s wall incl. import and catalog load\n")
    ratios = []
    never_dearer = True
    head = (f"{'task':24} {'who':9} {'choice':52} {'$/h':>9} {'total $':>9} {'ms/decision':>12}")
    print(head)
    print("-" * len(head))
    for t in TASKS:
        req = our_request(t)
        res = place(req, cat, egress)
        lat = []
        for _ in range(200):
            a = time.perf_counter()
            place(req, cat, egress)
            lat.append(time.perf_counter() - a)
        ours_ms = statistics.median(lat) * 1e3
        s = theirs[t["name"]]
        sky_ms = statistics.median(s["seconds"]) * 1e3
        o = res.placement
        their_total = reprice(cat, egress, req, s)
        if o is None:
            print(f"{t['name']:24} ours      no feasible placement: {dict(res.rejected)}")
            never_dearer = False
            continue
        ours = f"{o.provider}:{o.region}{'/' + o.zone if o.zone else ''} {o.instance_type} {o.capacity}"
        sky = f"{s['provider']}:{s['region']}{'/' + s['zone'] if s['zone'] else ''} {s['instance_type']}"
        sky += " spot" if s["spot"] else " on-demand"
        tt = "n/a" if their_total is None else f"{their_total:9.4f}"
        print(f"{t['name']:24} {'ours':9} {ours[:52]:52} {o.hourly_usd:9.4f} {o.total_usd:9.4f} {ours_ms:12.3f}")
        print(f"{'':24} {'SkyPilot':9} {sky[:52]:52} {s['hourly_usd']:9.4f} {tt:>9} {sky_ms:12.1f}")
        ratio = sky_ms / ours_ms
        ratios.append(ratio)
        dearer = their_total is not None and o.total_usd > their_total + 1e-9
        never_dearer &= not dearer
        print(f"{'':24} speedup x{ratio:,.0f}; ours is {'DEARER' if dearer else 'not dearer'}"
              + ("" if their_total is None else f" (saves ${their_total - o.total_usd:,.4f})"))
    print(f"\nvs_skypilot tasks={len(ratios)} speedup_median={statistics.median(ratios):.0f} "
          f"never_dearer={'yes' if never_dearer else 'no'}")


if __name__ == "__main__":
    main()
