"""Run one on-prem job command and record how it ended (stdlib only; started by ``providers.onprem``).

Usage: ``python _runner.py RUN_DIR WORKDIR [--user UID:GID] -- COMMAND...``. Writes stdout/stderr to
``RUN_DIR/stdout.log`` and ``RUN_DIR/stderr.log`` (``0600``) and, when the command ends, ``RUN_DIR/exit.json``
with ``exit_code`` (negative: killed by that signal), ``cpu_seconds`` and ``max_rss_mib`` from the kernel's
resource usage. With ``--user`` the command runs as that user and group, with no supplementary groups and
umask 077 (the runner itself stays the broker's user, so the job cannot touch its logs or exit record).

Design choice: a small wrapper process (not the broker) waits for the command, so the exit code and usage
are recorded even when the broker restarts meanwhile. It survives SIGTERM/SIGINT sent to its process
group (the command gets them and decides), so the exit code of a cancelled job is still written.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time


def _write_exit(run_dir: str, exit_code: int) -> None:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    data = {
        "exit_code": exit_code,
        "cpu_seconds": round(ru.ru_utime + ru.ru_stime, 6),
        "max_rss_mib": round(ru.ru_maxrss / 1024.0, 3),
        "ended_at": time.time(),
    }
    tmp = os.path.join(run_dir, "exit.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(run_dir, "exit.json"))


def main(argv: list[str]) -> int:
    os.umask(0o077)
    run_dir, workdir, *rest = argv
    as_user: dict[str, object] = {}
    if rest[:1] == ["--user"] and len(rest) > 1:
        uid, _, gid = rest[1].partition(":")
        as_user = {"user": int(uid), "group": int(gid), "extra_groups": [], "umask": 0o077}
        rest = rest[2:]
    sep, *command = rest or [""]
    if sep != "--" or not command:
        print("usage: _runner.py RUN_DIR WORKDIR [--user UID:GID] -- COMMAND...", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, lambda _s, _f: None)  # the command is in our group and gets the signal itself
    with open(os.path.join(run_dir, "stdout.log"), "ab") as out, open(
        os.path.join(run_dir, "stderr.log"), "ab"
    ) as err:
        try:
            child = subprocess.Popen(command, cwd=workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     **as_user)  # type: ignore[call-overload]
        except (OSError, subprocess.SubprocessError) as exc:
            err.write(f"hybrid-broker: cannot start {command[0]!r}: {exc}\n".encode())
            err.flush()
            _write_exit(run_dir, 127 if isinstance(exc, FileNotFoundError) else 126)
            return 0
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
    _write_exit(run_dir, code)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
