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
import time
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


class _Prober:
    """Runs a task process's liveness and readiness probes (:mod:`broker.ops.probes`, Kubernetes timing) in
    a thread, reports each result (``status`` with ``state: probe``, droppable), and kills the process when
    the liveness probe failed ``failureThreshold`` times in a row (``failed`` then says why)."""

    def __init__(self, probes: Mapping[str, Any], *, run: Callable[[Any], Any], report: Callable[..., None],
                 kill: Callable[[], None]) -> None:
        self.probes = probes  # "liveness"/"readiness" -> broker.ops.probes.Probe
        self._run, self._report, self._kill = run, report, kill
        self.failed: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="task-probes", daemon=True)

    def start(self) -> None:
        if self.probes:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        t0 = time.monotonic()
        due = {name: t0 + p.initial_delay_seconds for name, p in self.probes.items()}
        counts = {name: [0, 0, False] for name in self.probes}  # failures, successes, ready
        while not self._stop.wait(max(0.0, min(due.values()) - time.monotonic())):
            now = time.monotonic()
            for name, probe in self.probes.items():
                if due[name] > now or self._stop.is_set():
                    continue
                result = self._run(probe)
                c = counts[name]
                c[0], c[1] = (0, c[1] + 1) if result.ok else (c[0] + 1, 0)
                if name == "readiness":
                    c[2] = (c[2] or c[1] >= probe.success_threshold) and not (c[0] >= probe.failure_threshold)
                self._report(name, result.ok, c[0], c[1], bool(c[2]), result.message)
                due[name] = time.monotonic() + probe.period_seconds
                if name == "liveness" and c[0] >= probe.failure_threshold:
                    self.failed = f"liveness probe failed {c[0]} times ({result.message})"
                    self._kill()
                    return


def _probes_of(body: Mapping[str, Any]) -> dict[str, Any]:
    """The task's probes by name (``liveness``/``readiness``), parsed as the broker validated them."""
    docs = body.get("probes")
    if not docs:
        return {}
    from broker.ops.probes import parse_probe  # stdlib only: the agent needs no server dependencies

    if not isinstance(docs, Mapping):
        raise ValueError("probes is not a mapping")
    return {k.removesuffix("Probe"): parse_probe(v, f"spec.{k}") for k, v in docs.items()
            if k in ("livenessProbe", "readinessProbe")}


def run_task(
    body: Mapping[str, Any],
    *,
    workdir_root: Path,
    attempt: int,
    emit: Emit,
    handle: TaskHandle | None = None,
    user: str | None = None,
    restart_backoff_seconds: float = 10.0,
) -> tuple[str, int | None]:
    """Run the task in ``workdir_root/<task_id>`` (as ``user`` when the agent is root); returns
    ``(state, exit_code)`` with state ``succeeded`` or ``failed`` (``cancelled`` when cancelled through
    ``handle``; ``interrupted``, with no final result emitted, when interrupted through it).

    Probes (``body["probes"]``, the spec's ``livenessProbe``/``readinessProbe``) run next to the process
    (``exec`` as the task's user, in its directory, with its environment; ``httpGet``/``tcpSocket`` against
    the device, 127.0.0.1 by default). A liveness probe that fails ``failureThreshold`` times kills the
    process; with ``restart_policy`` ``OnFailure`` (default) the command starts again in the same directory
    after ``restart_backoff_seconds`` (doubling per restart, at most 300 s; as Kubernetes' CrashLoopBackOff),
    reported as a ``status`` ``restarted``; with ``Never`` the task fails saying so. The time limit covers
    every restart."""
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
        probes = _probes_of(body)
    except LookupError as exc:
        return fail(str(exc))
    except ValueError as exc:
        return fail(f"bad probe: {exc}")
    restart_policy = str(body.get("restart_policy") or "OnFailure")
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
    as_user = (account.pw_uid, account.pw_gid) if account is not None else None
    deadline = time.monotonic() + timeout
    timed_out = threading.Event()

    def on_timeout() -> None:
        timed_out.set()
        handle._kill()

    timer = threading.Timer(timeout, on_timeout)
    timer.daemon = True
    timer.start()
    restarts = 0
    try:
        while True:
            try:
                proc = subprocess.Popen(
                    command, cwd=wd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                    preexec_fn=_limits(mem, int(max(1.0, deadline - time.monotonic())) + 1), **ids,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return fail(f"cannot start {command[0]!r}: {exc}")
            handle.proc = proc
            if handle.on_start is not None:
                handle.on_start(process_tag(proc.pid, handle.run_id))
            if handle.cancelled or handle.interrupted or timed_out.is_set():
                handle._kill()
            if restarts == 0:
                emit([("status", {**base, "state": "running", "pid": proc.pid}, f"{task_id}/run{attempt}", False)])

            def report(name: str, ok: bool, failures: int, successes: int, ready: bool, message: str,
                       _r: int = restarts) -> None:
                emit([("status", {**base, "state": "probe", "probe": name, "ok": ok, "failures": failures,
                                  "successes": successes, "ready": ready, "message": message[:500],
                                  "restarts": _r}, f"{task_id}/probe-{uuid.uuid4().hex[:12]}", True)])

            prober = _Prober(probes, run=lambda pr: _probe(pr, wd, env, as_user), report=report,
                             kill=handle._kill)
            prober.start()
            try:
                code, n, error, out_tail, err_tail = _watch(proc, handle, base, task_id, emit)
            finally:
                prober.stop()
            if handle.interrupted:
                return "interrupted", None
            live = prober.failed is not None and not handle.cancelled and not timed_out.is_set()
            if live and restart_policy != "Never":
                restarts += 1
                delay = min(300.0, restart_backoff_seconds * 2 ** (restarts - 1))
                emit([("status", {**base, "state": "restarted", "probe": "liveness", "ok": False,
                                  "restarts": restarts, "message": f"{prober.failed}; restarting in {delay:g} s"},
                       f"{task_id}/restart{attempt}-{restarts}", False)])
                end = time.monotonic() + delay
                while time.monotonic() < end and not (handle.cancelled or handle.interrupted or timed_out.is_set()):
                    time.sleep(min(0.1, max(0.0, end - time.monotonic())))
                if handle.interrupted:
                    return "interrupted", None
                if not (handle.cancelled or timed_out.is_set()):
                    continue
            break
    finally:
        timer.cancel()
    if handle.cancelled:
        state = "cancelled"
    else:
        state = "succeeded" if code == 0 and not error and prober.failed is None else "failed"
    final: dict[str, Any] = {
        **base, "state": state, "exit_code": code, "final": True, "results": n,
        "stdout_tail": "\n".join(out_tail)[-_TAIL_BYTES:],
        "stderr_tail": b"".join(err_tail).decode(errors="replace")[-_TAIL_BYTES:],
    }
    if restarts:
        final["restarts"] = restarts
    if timed_out.is_set():
        final["error"] = f"time limit of {timeout:g} s exceeded"
    elif error:
        final["error"] = error[0]
    elif prober.failed is not None and not handle.cancelled:
        final["error"] = f"{prober.failed}; restartPolicy Never: the task fails"
    emit([("result", final, f"{task_id}/final", False)])
    return state, code


def _probe(probe: Any, wd: Path, env: Mapping[str, str], as_user: tuple[int, int] | None) -> Any:
    from broker.ops.probes import run_probe

    return run_probe(probe, cwd=str(wd), env=env, as_user=as_user)


def _watch(proc: subprocess.Popen[bytes], handle: TaskHandle, base: Mapping[str, Any], task_id: str,
           emit: Emit) -> tuple[int, int, list[str], deque[str], deque[bytes]]:
    """Stream one process's output until it ends: ``@hb-result`` lines as results (a too-long one kills
    the task and is the error), tails of the rest; then kill what it left behind. Returns
    ``(exit code, results, errors, stdout tail, stderr tail)``."""
    error: list[str] = []
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
    kill_task(process_tag(proc.pid, handle.run_id))  # whatever it left behind (a daemonized child) goes too
    err_thread.join(timeout=5)
    return code, n, error, out_tail, err_tail


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
