"""Trace replay speed: N synthetic submissions over one day re-run through the real scheduler in simulated
time (broker.ops.replay), against an 8-host owned fleet plus three dry-run clouds. Ends with one JSON line.

    .venv/bin/python bench/replay.py [--jobs 10000] [--tick 300] [--days 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.ops.replay import replay, synthetic_trace  # noqa: E402

FLEET = "sites:\n  - {name: dc1, continent: eu, uplink_gbps: 10}\nhosts:\n" + "".join(
    f"  - {{name: h{i}, site: dc1, vcpus: 64, memory_gib: 256, owned_usd_per_hour: 0.9}}\n" for i in range(8))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--tick", type=float, default=300.0)
    ap.add_argument("--days", type=float, default=1.0)
    args = ap.parse_args()
    trace = synthetic_trace(args.jobs, start=datetime(2026, 12, 1, tzinfo=UTC), days=args.days, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "fleet.yaml"
        inv.write_text(FLEET)
        result = replay(trace, inventory=inv, tick_seconds=args.tick)
    out = result.summary()
    out["jobs_per_second"] = round(result.jobs / result.wall_seconds, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
