"""Runs one task as a subprocess in its own working directory, with time and memory limits, as an
unprivileged user and away from the device's identity.

A task body (the ``task`` downlink) is::

    {"task_id": "...", "job_id": "...", "command": ["python", "x.py"], "env": {...},
     "timeout_seconds": 3600, "memory_mib": 512, "expires_ms": <unix ms>}

Contract of :func:`run_task`: it blocks until the process ends, and reports through ``emit`` (kind,
body, message id, droppable): a ``status`` (running), one ``result`` per stdout line starting with
``@hb-result `` (ids ``<task>/r<n>``, so a re-run after a reboot re-emits the same ids and nothing
is counted twice; streamed: a batch goes out at 500 lines or when output pauses for 0.2 s), and a final
``result`` (id ``<task>/final``) with the exit code and output tails.

Isolation: the task runs as ``user`` (the agent's ``task_user``, created by ``edge-agent install``) when the
agent is root, with a clean environment (``PATH``, ``HOME``/``TMPDIR`` = its working directory, ``LANG``,
the spec's ``env``, ``HB_TASK_ID``, ``HB_JOB_ID``, ``HB_TASK_RUN``) and its working directory under
``workdir_root``, which lies outside the agent's state directory (``device.key`` stays unreadable). The memory limit is
``RLIMIT_AS``. A time limit or a cancel kills every process of the task: its process group, its
descendants, and any process carrying its ``HB_TASK_RUN`` (which a ``setsid`` or double-forked child keeps).
A result line longer than :data:`MAX_RESULT_BYTES` fails the task with a clear error (the device's uplink
carries at most ``protocol.MAX_PAYLOAD_BYTES`` per message).
"""

from __future__ import annotations

import json
import os
import pwd
import queue
import resource
import signal
import subprocess
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

from edge import protocol

__all__ = ["run_task", "Emit", "RESULT_PREFIX", "MAX_RESULT_BYTES", "TaskHandle", "kill_task", "process_tag",
           "TASK_PATH"]

RESULT_PREFIX = "@hb-result "
MAX_RESULT_BYTES = 128 * 1024  # one result's encoded body; leaves room in an uplink for the envelope
TASK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
Emit = Callable[[list[tuple[str, Mapping[str, Any], str, bool]]], None]
_TAIL_BYTES = 4096
_BATCH = 500
_FLUSH_S = 0.2


class TaskHandle:
    """Lets another thread cancel a running task."""

    def __init__(self, on_start: Callable[[str], None] | None = None) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.run_id = uuid.uuid4().hex  # in the task's environment as HB_TASK_RUN: finds all its processes
        self.cancelled = False
        self.interrupted = False
        self.on_start = on_start

    def cancel(self) -> None:
        """Kill the task for good: it ends ``cancelled``."""
        self.cancelled = True
        self._kill()

    def interrupt(self) -> None:
        """Kill the task because the agent stops: no outcome is reported, it restarts on next start."""
        self.interrupted = True
        self._kill()

    def _kill(self) -> None:
        if self.proc is not None:
            kill_task(process_tag(self.proc.pid, self.run_id))


def process_tag(pid: int, run_id: str) -> str:
    """``"<pid>:<start time>:<run id>"``: names a task's first process for good (a pid alone may be reused
    after a reboot) and the run id every process of the task carries (``HB_TASK_RUN``)."""
    try:
        started = f"{psutil.Process(pid).create_time():.3f}"
    except psutil.Error:
        started = "0"
    return f"{pid}:{started}:{run_id}"


def _same_process(pid_s: str, started: str) -> psutil.Process | None:
    try:
        proc = psutil.Process(int(pid_s))
        return proc if f"{proc.create_time():.3f}" == started else None
    except (psutil.Error, ValueError):
        return None


def kill_task(tag: str) -> int:
    """SIGKILL every process of the task run ``tag`` (:func:`process_tag`) names: its first process, if it
    is still that process, with its process group and descendants, and every process whose environment
    carries its ``HB_TASK_RUN`` (a ``setsid`` or double-forked child keeps it). Processes are checked before
    they are killed, so a stale saved pid (reused by another program after a reboot) is left alone.
    Returns how many processes were killed."""
    pid_s, _, rest = tag.partition(":")
    started, _, run_id = rest.partition(":")
    victims: dict[int, psutil.Process] = {}
    me = os.getpid()
    leader = _same_process(pid_s, started)
    if leader is not None:
        victims[leader.pid] = leader
        try:
            victims.update((c.pid, c) for c in leader.children(recursive=True))
            pgid = os.getpgid(leader.pid)
        except (psutil.Error, OSError):
            pgid = -1
        if pgid > 1 and pgid != os.getpgid(me):
            with _quiet():
                os.killpg(pgid, signal.SIGKILL)
    if run_id:
        for proc in psutil.process_iter():
            if proc.pid in (me, 1) or proc.pid in victims:
                continue
            with _quiet():
                if proc.environ().get("HB_TASK_RUN") == run_id:
                    victims[proc.pid] = proc
    others: list[psutil.Process] = []
    for proc in victims.values():
        with _quiet():
            if proc.ppid() != me:  # our own child is reaped by its Popen (psutil would take its exit code)
                others.append(proc)
            proc.kill()
    psutil.wait_procs(others, timeout=2)
    return len(victims)


class _quiet:
    """Ignore processes that vanished or cannot be inspected while we look at them."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, _tb: Any) -> bool:
        return exc_type is not None and issubclass(exc_type, (psutil.Error, ProcessLookupError, PermissionError))


def _limits(memory_bytes: int | None, cpu_seconds: int | None) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec, after the switch to the task user
        if memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        if cpu_seconds:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))

    return apply


def _task_user(user: str | None) -> pwd.struct_passwd | None:
    """The account to run as: ``user`` when the agent is root; None (the agent's own) otherwise or when
    ``user`` is empty. Raises ``LookupError`` when root was asked to switch to a user that does not exist."""
    if not user or os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(user)
    except KeyError:
        raise LookupError(f"task user {user!r} does not exist. To fix: run `edge-agent install` (creates it) "
                          f"or useradd --system {user}") from None


def run_task(
    body: Mapping[str, Any],
    *,
    workdir_root: Path,
    attempt: int,
    emit: Emit,
    handle: TaskHandle | None = None,
    user: str | None = None,
) -> tuple[str, int | None]:
    """Run the task in ``workdir_root/<task_id>`` (as ``user`` when the agent is root); returns
    ``(state, exit_code)`` with state ``succeeded`` or ``failed`` (``cancelled`` when cancelled through
    ``handle``; ``interrupted``, with no final result emitted, when interrupted through it)."""
    task_id = str(body["task_id"])
    job_id = str(body.get("job_id", ""))
    command = [str(c) for c in body.get("command") or []]
    handle = handle or TaskHandle()
    base = {"task_id": task_id, "job_id": job_id, "attempt": attempt}

    def fail(error: str) -> tuple[str, int | None]:
        emit([("result", {**base, "state": "failed", "exit_code": None, "final": True, "error": error},
               f"{task_id}/final", False)])
        return "failed", None

    if not command:
        return fail("task has no command")
    try:
        account = _task_user(user)
    except LookupError as exc:
        return fail(str(exc))
    wd = workdir_root / task_id
    wd.mkdir(parents=True, exist_ok=True)
    if account is not None:
        workdir_root.chmod(0o711)  # the task user may enter its own directory, not list the others
        os.chown(wd, account.pw_uid, account.pw_gid)
        wd.chmod(0o700)
    env = {"PATH": TASK_PATH, "HOME": str(wd), "TMPDIR": str(wd), "LANG": "C.UTF-8",
           **{str(k): str(v) for k, v in (body.get("env") or {}).items()},
           "HB_TASK_ID": task_id, "HB_JOB_ID": job_id, "HB_TASK_RUN": handle.run_id}
    if account is not None:
        env["USER"] = env["LOGNAME"] = account.pw_name
    timeout = float(body.get("timeout_seconds") or 3600)
    mem_mib = body.get("memory_mib")
    mem = int(float(mem_mib) * 1024 * 1024) if mem_mib else None
    ids: dict[str, Any] = {}
    if account is not None:
        ids = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
    try:
        proc = subprocess.Popen(
            command, cwd=wd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_limits(mem, int(timeout) + 1), **ids,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return fail(f"cannot start {command[0]!r}: {exc}")
    handle.proc = proc
    if handle.on_start is not None:
        handle.on_start(process_tag(proc.pid, handle.run_id))
    if handle.cancelled or handle.interrupted:
        handle._kill()
    emit([("status", {**base, "state": "running", "pid": proc.pid}, f"{task_id}/run{attempt}", False)])
    timed_out = threading.Event()
    error: list[str] = []

    def on_timeout() -> None:
        timed_out.set()
        handle._kill()

    timer = threading.Timer(timeout, on_timeout)
    timer.daemon = True
    timer.start()
    err_tail: deque[bytes] = deque(maxlen=64)
    assert proc.stdout is not None and proc.stderr is not None
    err_thread = threading.Thread(target=_read_tail, args=(proc.stderr, err_tail), daemon=True)
    err_thread.start()
    lines: queue.Queue[bytes | None] = queue.Queue(maxsize=4 * _BATCH)  # bounded: backpressure on the task
    out_thread = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
    out_thread.start()
    out_tail: deque[str] = deque(maxlen=64)
    batch: list[tuple[str, Mapping[str, Any], str, bool]] = []
    n = 0
    while True:
        try:
            raw = lines.get(timeout=_FLUSH_S)
        except queue.Empty:
            raw = b""
        if raw is None:
            break
        if raw and not error:
            if raw.startswith(RESULT_PREFIX.encode()):
                item = _result(base, task_id, n, raw)
                if item is None:
                    error.append(f"result line {n} is longer than the {MAX_RESULT_BYTES} byte limit of one "
                                 "result. To fix: print smaller @hb-result lines (split the "
                                 "value, or write big outputs to a data output)")
                    handle._kill()
                    continue
                batch.append(item)
                n += 1
            else:
                out_tail.append(raw[:_TAIL_BYTES].decode(errors="replace").rstrip("\n"))
        if batch and (len(batch) >= _BATCH or not raw):
            emit(batch)
            batch = []
    if batch:
        emit(batch)
    code = proc.wait()
    timer.cancel()
    kill_task(process_tag(proc.pid, handle.run_id))  # whatever it left behind (a daemonized child) goes too
    err_thread.join(timeout=5)
    if handle.interrupted:
        return "interrupted", None
    if handle.cancelled:
        state = "cancelled"
    else:
        state = "succeeded" if code == 0 and not error else "failed"
    final: dict[str, Any] = {
        **base, "state": state, "exit_code": code, "final": True, "results": n,
        "stdout_tail": "\n".join(out_tail)[-_TAIL_BYTES:],
        "stderr_tail": b"".join(err_tail).decode(errors="replace")[-_TAIL_BYTES:],
    }
    if timed_out.is_set():
        final["error"] = f"time limit of {timeout:g} s exceeded"
    elif error:
        final["error"] = error[0]
    emit([("result", final, f"{task_id}/final", False)])
    return state, code


def _result(base: Mapping[str, Any], task_id: str, n: int,
            raw: bytes) -> tuple[str, Mapping[str, Any], str, bool] | None:
    """The outbox item of result line ``n``, or None when its encoded body would exceed the limit."""
    if len(raw) > MAX_RESULT_BYTES + len(RESULT_PREFIX) + 1:
        return None
    text = raw[len(RESULT_PREFIX):].decode(errors="replace").rstrip("\n")
    try:
        value: Any = json.loads(text)
        protocol.verify_shape(protocol.Envelope(0, "", "", 0, 0, "", {"value": value}))
    except (ValueError, RecursionError, protocol.Rejected):
        value = text
    body = {**base, "n": n, "value": value}
    if len(protocol.canonical(body)) > MAX_RESULT_BYTES:
        return None
    return "result", body, f"{task_id}/r{n}", False


def _read_lines(stream: Any, out: queue.Queue[bytes | None]) -> None:
    """Put stdout's lines on ``out``, each cut at the result limit (the rest of a longer line is read
    and dropped, so memory stays bounded whatever the task prints), then None at the end."""
    cap = MAX_RESULT_BYTES + len(RESULT_PREFIX) + 2
    try:
        while True:
            line = stream.readline(cap)
            if not line:
                break
            if not line.endswith(b"\n") and len(line) >= cap:
                while True:  # skip to the end of this overlong line
                    rest = stream.readline(64 * 1024)
                    if not rest or rest.endswith(b"\n"):
                        break
            out.put(line)
    finally:
        out.put(None)


def _read_tail(stream: Any, tail: deque[bytes]) -> None:
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            break
        tail.append(chunk)
