#!/usr/bin/env python3
"""A preemptible example workload: counts to a target, checkpoints, and resumes.

Each step adds the next number to a running sum (so a wrong restore gives a wrong answer) and takes
``--step-seconds``. Every ``--interval-seconds`` and on SIGTERM/SIGINT it writes its state atomically to
``<checkpoint dir>/state.json``; started again with the same checkpoint directory it resumes from there.
When it reaches ``--target`` it writes ``result.json`` (``{"count": N, "sum": N(N+1)/2, ...}``) and exits 0.
Preempted, it exits 143 (128 + SIGTERM) after its checkpoint.

Every run appends one line to ``<checkpoint dir>/runs.log`` (``start=<count> end=<count> reason=...``) so a
test can measure the work a preemption lost: steps done in all runs minus the target.

The checkpoint directory is ``--checkpoint``, else ``$HB_CHECKPOINT_DIR`` (the broker sets it from the job's
``checkpoint.path``). Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType


def _write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=int, default=100, help="count up to this number")
    parser.add_argument("--step-seconds", type=float, default=0.05, help="time one step takes")
    parser.add_argument("--interval-seconds", type=float, default=1.0, help="time between checkpoints")
    parser.add_argument("--checkpoint", default=os.environ.get("HB_CHECKPOINT_DIR"), help="checkpoint directory")
    args = parser.parse_args(argv)
    if not args.checkpoint:
        print("error: no checkpoint directory. To fix: pass --checkpoint DIR or set HB_CHECKPOINT_DIR",
              file=sys.stderr)
        return 2
    ckpt = Path(args.checkpoint)
    ckpt.mkdir(parents=True, exist_ok=True)
    state_file = ckpt / "state.json"
    state = {"count": 0, "sum": 0, "checkpoints": 0}
    if state_file.exists():
        state.update(json.loads(state_file.read_text(encoding="utf-8")))
    start = int(state["count"])
    stop = {"signal": 0}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def checkpoint() -> None:
        state["checkpoints"] = int(state["checkpoints"]) + 1
        _write_json(state_file, {**state, "written_at": time.time()})

    def log_run(reason: str) -> None:
        with open(ckpt / "runs.log", "a", encoding="utf-8") as f:
            f.write(f"start={start} end={state['count']} reason={reason} pid={os.getpid()}\n")

    print(f"resuming at {start}" if start else "starting at 0", flush=True)
    last = time.monotonic()
    while int(state["count"]) < args.target:
        if stop["signal"]:
            checkpoint()
            log_run("preempted")
            print(f"signal {stop['signal']}: checkpointed at {state['count']}", flush=True)
            return 128 + int(stop["signal"])
        time.sleep(args.step_seconds)
        state["count"] = int(state["count"]) + 1
        state["sum"] = int(state["sum"]) + int(state["count"])
        if time.monotonic() - last >= args.interval_seconds:
            checkpoint()
            last = time.monotonic()
    checkpoint()
    log_run("done")
    _write_json(ckpt / "result.json", {"count": state["count"], "sum": state["sum"],
                                       "checkpoints": state["checkpoints"]})
    print(f"done: count={state['count']} sum={state['sum']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
