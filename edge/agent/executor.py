"""Runs one task as a subprocess in its own working directory, with time and memory limits.

A task body (the ``task`` downlink) is::

    {"task_id": "...", "job_id": "...", "command": ["python", "x.py"], "env": {...},
     "timeout_seconds": 3600, "memory_mib": 512, "expires_ms": <unix ms>}

Contract of :func:`run_task`: it blocks until the process ends, and reports through ``emit`` (kind,
body, message id, droppable): a ``status`` (running), one ``result`` per stdout line starting with
``@hb-result `` (ids ``<task>/r<n>``, so a re-run after a reboot re-emits the same ids and nothing
is counted twice), and a final ``result`` (id ``<task>/final``) with the exit code and output tails.
The memory limit is ``RLIMIT_AS``; the time limit kills the whole process group (exit code -9).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["run_task", "Emit", "RESULT_PREFIX", "TaskHandle", "kill_group_of"]

RESULT_PREFIX = "@hb-result "
Emit = Callable[[list[tuple[str, Mapping[str, Any], str, bool]]], None]
_TAIL_BYTES = 4096
_BATCH = 500


class TaskHandle:
    """Lets another thread cancel a running task."""

    def __init__(self, on_start: Callable[[int], None] | None = None) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.cancelled = False
        self.interrupted = False
        self.on_start = on_start

    def cancel(self) -> None:
        """Kill the task for good: it ends ``cancelled``."""
        self.cancelled = True
        _kill_group(self.proc)

    def interrupt(self) -> None:
        """Kill the task because the agent stops: no outcome is reported, it restarts on next start."""
        self.interrupted = True
        _kill_group(self.proc)


def _kill_group(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_group_of(pid: int) -> bool:
    """Kill the process group led by ``pid`` (a task left over from a killed agent); False if gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _limits(memory_bytes: int | None, cpu_seconds: int | None) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec
        if memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        if cpu_seconds:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))

    return apply


def run_task(
    body: Mapping[str, Any],
    *,
    workdir_root: Path,
    attempt: int,
    emit: Emit,
    handle: TaskHandle | None = None,
) -> tuple[str, int | None]:
    """Run the task in ``workdir_root/<task_id>``; returns ``(state, exit_code)`` with state
    ``succeeded`` or ``failed`` (``cancelled`` when cancelled through ``handle``; ``interrupted``, with no
    final result emitted, when interrupted through it)."""
    task_id = str(body["task_id"])
    job_id = str(body.get("job_id", ""))
    command = [str(c) for c in body.get("command") or []]
    handle = handle or TaskHandle()
    base = {"task_id": task_id, "job_id": job_id, "attempt": attempt}
    if not command:
        emit([("result", {**base, "state": "failed", "exit_code": None, "final": True,
                          "error": "task has no command"}, f"{task_id}/final", False)])
        return "failed", None
    wd = workdir_root / task_id
    wd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **{str(k): str(v) for k, v in (body.get("env") or {}).items()},
           "HB_TASK_ID": task_id, "HB_JOB_ID": job_id}
    timeout = float(body.get("timeout_seconds") or 3600)
    mem_mib = body.get("memory_mib")
    mem = int(float(mem_mib) * 1024 * 1024) if mem_mib else None
    try:
        proc = subprocess.Popen(
            command, cwd=wd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_limits(mem, int(timeout) + 1),
        )
    except OSError as exc:
        emit([("result", {**base, "state": "failed", "exit_code": None, "final": True,
                          "error": f"cannot start {command[0]!r}: {exc}"}, f"{task_id}/final", False)])
        return "failed", None
    handle.proc = proc
    if handle.on_start is not None:
        handle.on_start(proc.pid)
    if handle.cancelled or handle.interrupted:
        _kill_group(proc)
    emit([("status", {**base, "state": "running", "pid": proc.pid}, f"{task_id}/run{attempt}", False)])
    timed_out = threading.Event()

    def on_timeout() -> None:
        timed_out.set()
        _kill_group(proc)

    timer = threading.Timer(timeout, on_timeout)
    timer.daemon = True
    timer.start()
    err_tail: deque[bytes] = deque(maxlen=64)
    err_thread = threading.Thread(target=lambda: err_tail.extend(proc.stderr or ()), daemon=True)
    err_thread.start()
    out_tail: deque[str] = deque(maxlen=64)
    batch: list[tuple[str, Mapping[str, Any], str, bool]] = []
    n = 0
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith(RESULT_PREFIX):
            text = line[len(RESULT_PREFIX):]
            try:
                value: Any = json.loads(text)
            except ValueError:
                value = text
            batch.append(("result", {**base, "n": n, "value": value}, f"{task_id}/r{n}", False))
            n += 1
            if len(batch) >= _BATCH:
                emit(batch)
                batch = []
        else:
            out_tail.append(line)
    if batch:
        emit(batch)
    code = proc.wait()
    timer.cancel()
    err_thread.join(timeout=5)
    if handle.interrupted:
        return "interrupted", None
    if handle.cancelled:
        state = "cancelled"
    else:
        state = "succeeded" if code == 0 else "failed"
    final: dict[str, Any] = {
        **base, "state": state, "exit_code": code, "final": True, "results": n,
        "stdout_tail": "\n".join(out_tail)[-_TAIL_BYTES:],
        "stderr_tail": b"".join(err_tail).decode(errors="replace")[-_TAIL_BYTES:],
    }
    if timed_out.is_set():
        final["error"] = f"time limit of {timeout:g} s exceeded"
    emit([("result", final, f"{task_id}/final", False)])
    return state, code
