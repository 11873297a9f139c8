"""The start-up script every cloud VM of a job runs, and the parser of what it reports on the serial console.

One POSIX ``sh`` script for all three clouds: EC2 user data, Azure custom data (cloud-init runs a ``#!``
script as is) and the GCE ``startup-script`` metadata item. It

1. runs the job's command (argv, each word quoted) with its env in its working directory, stdout and stderr
   to a log file, under ``timeout`` when the image has it (runtime limit: exit code 124 when it hits);
2. writes two lines to each serial console: ``HB-LOG-TAIL=<base64 of the log's last bytes>`` and
   ``HB-EXIT-CODE=<n>`` (base64, so console noise and the job's own output cannot fake or break the report);
3. powers the VM off (EC2 ``terminate`` on shutdown; Azure and GCE stop it and the broker deletes it).

The consoles are the shell variable ``hb_consoles`` (default ``/dev/ttyS0 /dev/console``; the environment
variable ``HB_CONSOLES`` overrides it, which is how the local fakes give the script a file as its serial
port). Adapters read the console back (EC2 ``GetConsoleOutput``, Azure boot diagnostics, GCE
``getSerialPortOutput``) and parse it with :func:`parse_report`.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker.errors import InvalidRequestError
from broker.model import JobSpec

__all__ = [
    "job_script",
    "parse_exit_code",
    "parse_log_tail",
    "parse_report",
    "runtime_limit_seconds",
    "Report",
    "EXIT_CODE_MARKER",
    "LOG_TAIL_MARKER",
    "CONSOLES",
    "LOG_TAIL_BYTES",
    "TIMEOUT_EXIT_CODE",
]

EXIT_CODE_MARKER = "HB-EXIT-CODE="
LOG_TAIL_MARKER = "HB-LOG-TAIL="
CONSOLES = ("/dev/ttyS0", "/dev/console")
LOG_TAIL_BYTES = 4096
TIMEOUT_EXIT_CODE = 124  # what coreutils ``timeout`` exits with when the limit hits
KILL_AFTER_SECONDS = 30
_EXIT_RE = re.compile(r"^" + re.escape(EXIT_CODE_MARKER) + r"(\d{1,3})\r?$", re.MULTILINE)
_TAIL_RE = re.compile(r"^" + re.escape(LOG_TAIL_MARKER) + r"([A-Za-z0-9+/=]*)\r?$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Report:
    """What a VM's console says about its job: ``exit_code`` (``None`` until the job ended) and ``log_tail``."""

    exit_code: int | None
    log_tail: str = ""


def runtime_limit_seconds(job: JobSpec, max_runtime_hours: float | None = None) -> int:
    """How long the job may run on a VM before ``timeout`` stops it: ``max_runtime_hours`` when given, else
    twice the job's ``durationHours`` estimate plus one hour (an estimate is not a limit, but a VM must not
    bill forever)."""
    hours = max_runtime_hours if max_runtime_hours else 2.0 * job.request.duration_hours + 1.0
    return max(60, int(math.ceil(hours * 3600)))


def job_script(
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    *,
    consoles: Sequence[str] = CONSOLES,
    poweroff: str = "poweroff",
    runtime_limit_seconds: int | None = None,
    log_tail_bytes: int = LOG_TAIL_BYTES,
    provider: str = "aws",
    max_bytes: int | None = None,
) -> str:
    """The start-up script of a job's VM (see the module docstring). ``workdir`` is created when missing (a
    fresh ``mktemp -d`` directory when ``None``); if it cannot be entered the command does not run and the
    exit code is 125. ``poweroff`` is a shell command taken as is (tests pass a harmless one); everything
    else is quoted.

    Raises :class:`InvalidRequestError` for an empty command, an env name that is empty or holds ``=``, a NUL
    byte anywhere, or a script over ``max_bytes`` (the cloud's limit on user/custom data)."""
    env = dict(env or {})
    words = list(command)
    if not words:
        raise InvalidRequestError(f"{provider}: the job has no command to run. To fix: give the job a command.",
                                  provider=provider)
    bad = [k for k in env if not k or "=" in k]
    if bad:
        raise InvalidRequestError(f"{provider}: env names {bad!r} cannot be set (empty or containing '='). "
                                  "To fix: rename those environment variables.", provider=provider)
    if any("\0" in x for x in [*words, *env, *env.values(), workdir or "", *consoles]):
        raise InvalidRequestError(f"{provider}: the job's command, env or workdir holds a NUL byte. To fix: "
                                  "remove it.", provider=provider)
    run = " ".join(shlex.quote(w) for w in words)
    if env:
        assigns = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
        run = f"env {assigns} {run}"
    wd = shlex.quote(workdir) if workdir else '"$(mktemp -d "${TMPDIR:-/tmp}/hb-job.XXXXXX")"'
    limit = ""
    if runtime_limit_seconds:
        limit = f"timeout -k {KILL_AFTER_SECONDS} {int(runtime_limit_seconds)} "
    lines = [
        "#!/bin/sh",
        "# hybrid-broker job runner (generated): run the job, report its exit code and log tail on the serial",
        "# console, power off.",
        f"hb_consoles=\"${{HB_CONSOLES:-{' '.join(consoles)}}}\"",
        'hb_log="$(mktemp "${TMPDIR:-/tmp}/hb-log.XXXXXX")" || hb_log=/dev/null',
        f"hb_wd={wd}",
        'if [ -n "$hb_wd" ] && mkdir -p "$hb_wd" && cd "$hb_wd"; then',
        "  hb_limit=''",
        f"  command -v timeout >/dev/null 2>&1 && hb_limit={shlex.quote(limit)}",
        f'  $hb_limit {run} > "$hb_log" 2>&1 < /dev/null',
        "  hb_rc=$?",
        "else",
        "  hb_rc=125",
        "fi",
        f"hb_tail=\"$(tail -c {int(log_tail_bytes)} \"$hb_log\" 2>/dev/null | base64 | tr -d '\\n')\"",
        "for hb_tty in $hb_consoles; do",
        f'  {{ printf \'%s%s\\n%s%s\\n\' {shlex.quote(LOG_TAIL_MARKER)} "$hb_tail" '
        f'{shlex.quote(EXIT_CODE_MARKER)} "$hb_rc" > "$hb_tty"; }} 2>/dev/null || :',
        "done",
        poweroff,
        "",
    ]
    script = "\n".join(lines)
    size = len(script.encode())
    if max_bytes is not None and size > max_bytes:
        raise InvalidRequestError(
            f"{provider}: the job's start-up script is {size} bytes, over the {max_bytes}-byte limit of its "
            "user/custom data. To fix: shorten the command/env (e.g. put them in a script inside the image).",
            provider=provider,
        )
    return script


def parse_exit_code(console: str) -> int | None:
    """The exit code of the last ``HB-EXIT-CODE=<n>`` line (0..255) in a console text, else ``None``."""
    found = [int(m) for m in _EXIT_RE.findall(console) if int(m) <= 255]
    return found[-1] if found else None


def parse_log_tail(console: str) -> str:
    """The job's log tail from the last well-formed ``HB-LOG-TAIL=<base64>`` line, else ``""``."""
    for raw in reversed(_TAIL_RE.findall(console)):
        try:
            return base64.b64decode(raw, validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            continue
    return ""


def parse_report(console: str) -> Report:
    """Exit code and log tail a job's VM wrote on its console (:func:`job_script`)."""
    return Report(parse_exit_code(console), parse_log_tail(console))
