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
    "script_for",
    "parse_exit_code",
    "parse_log_tail",
    "parse_report",
    "runtime_limit_seconds",
    "Report",
    "EXIT_CODE_MARKER",
    "PREEMPTED_MARKER",
    "INTERRUPTION_CHECKS",
    "LOG_TAIL_MARKER",
    "CONSOLES",
    "LOG_TAIL_BYTES",
    "TIMEOUT_EXIT_CODE",
]

EXIT_CODE_MARKER = "HB-EXIT-CODE="
PREEMPTED_MARKER = "HB-PREEMPTED=1"
# In-guest checks of each cloud's spot interruption notice (true while a notice is out): the EC2 2-minute
# notice (IMDSv2 spot/instance-action), Azure Scheduled Events (Preempt), GCE's preempted flag.
INTERRUPTION_CHECKS = {
    "aws": "hb_t=$(curl -sf -m 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "
           "http://169.254.169.254/latest/api/token) && curl -sf -m 2 -H \"X-aws-ec2-metadata-token: $hb_t\" "
           "http://169.254.169.254/latest/meta-data/spot/instance-action >/dev/null",
    "azure": "curl -sf -m 2 -H Metadata:true "
             "'http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01' | grep -q '\"Preempt\"'",
    "gcp": "curl -sf -m 2 -H 'Metadata-Flavor: Google' "
           "http://metadata.google.internal/computeMetadata/v1/instance/preempted | grep -q TRUE",
}
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
    preempted: bool = False  # the VM saw its cloud's interruption notice and stopped the job for it
    pending: bool = False  # the VM ended but its console may not hold the report yet: ask again


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
    watch_interruptions: bool = False,
    wait_gpu_driver_seconds: int | None = None,
) -> str:
    """The start-up script of a job's VM (see the module docstring). ``workdir`` is created when missing (a
    fresh ``mktemp -d`` directory when ``None``); if it cannot be entered the command does not run and the
    exit code is 125. ``poweroff`` is a shell command taken as is (tests pass a harmless one); everything
    else is quoted.

    ``watch_interruptions`` (spot capacity) adds a watcher that polls the cloud's interruption notice
    (:data:`INTERRUPTION_CHECKS`, every ``$HB_INTERRUPT_POLL`` seconds, default 5): on a notice the job gets
    SIGTERM (its cue to checkpoint; ``HB_CHECKPOINT_PATH`` names where, when the job spec has one) and the
    console gets ``HB-PREEMPTED=1`` before the exit code, so the broker places the job again instead of
    counting a failure.

    ``wait_gpu_driver_seconds`` (a GPU VM whose driver a VM extension installs after boot: Azure's
    ``NvidiaGpuDriverLinux``) makes the script wait until ``nvidia-smi`` works, polling every
    ``$HB_GPU_POLL`` seconds (default 10), before the command runs; past the limit the command does not run,
    the exit code is 125 and the log says why. As the extension may reboot the VM to load the driver, the
    script first copies itself to cloud-init's per-boot directory (``$HB_PER_BOOT_DIR``, default
    ``/var/lib/cloud/scripts/per-boot``) so it starts again after that reboot, and marks the start of the
    command in ``$HB_STATE_DIR`` (default ``/var/lib/hybrid-broker``) so it never runs twice.

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
        'hb_notice="$hb_log.preempted"',
        f"hb_wd={wd}",
        "hb_ready=1",
    ]
    if wait_gpu_driver_seconds:
        lines += [
            'hb_state="${HB_STATE_DIR:-/var/lib/hybrid-broker}"; hb_boot="${HB_PER_BOOT_DIR:-/var/lib/cloud/scripts/'
            'per-boot}"',
            '[ -e "$hb_state/job.started" ] && exit 0  # started before a reboot: this boot has nothing to do',
            'mkdir -p "$hb_boot" "$hb_state" 2>/dev/null; [ "$0" -ef "$hb_boot/hb-job.sh" ] || '
            '{ cp "$0" "$hb_boot/hb-job.sh" && chmod 700 "$hb_boot/hb-job.sh"; } 2>/dev/null',
            "hb_t0=$(date +%s)",
            f'until nvidia-smi >/dev/null 2>&1 || [ $(($(date +%s) - hb_t0)) -ge {int(wait_gpu_driver_seconds)} ]; do',
            '  sleep "${HB_GPU_POLL:-10}"',
            "done",
            'rm -f "$hb_boot/hb-job.sh"; : > "$hb_state/job.started"',
            f'nvidia-smi >/dev/null 2>&1 || {{ echo "hb: no working NVIDIA driver (nvidia-smi) after '
            f'{int(wait_gpu_driver_seconds)} s: the GPU driver extension did not finish" > "$hb_log"; hb_ready=0; }}',
        ]
    lines += [
        'if [ "$hb_ready" = 1 ] && [ -n "$hb_wd" ] && mkdir -p "$hb_wd" && cd "$hb_wd"; then',
        "  hb_limit=''",
        f"  command -v timeout >/dev/null 2>&1 && hb_limit={shlex.quote(limit)}",
    ]
    if watch_interruptions:
        check = INTERRUPTION_CHECKS.get(provider)
        if check is None:
            raise InvalidRequestError(f"{provider}: no spot interruption check is known. To fix: report this.",
                                      provider=provider)
        lines += [
            f'  $hb_limit {run} > "$hb_log" 2>&1 < /dev/null &',
            "  hb_pid=$!",
            "  ( while kill -0 \"$hb_pid\" 2>/dev/null; do",
            f"      if {check}; then",
            '        : > "$hb_notice"; kill -TERM "$hb_pid" 2>/dev/null; break',
            "      fi",
            '      sleep "${HB_INTERRUPT_POLL:-5}"',
            "    done ) &",
            "  hb_wpid=$!",
            '  wait "$hb_pid"',
            "  hb_rc=$?",
            '  kill "$hb_wpid" 2>/dev/null',
        ]
    else:
        lines += [
            f'  $hb_limit {run} > "$hb_log" 2>&1 < /dev/null',
            "  hb_rc=$?",
        ]
    lines += [
        "else",
        "  hb_rc=125",
        "fi",
        f'[ -e "$hb_notice" ] && for hb_tty in $hb_consoles; do {{ echo {shlex.quote(PREEMPTED_MARKER)} '
        '>> "$hb_tty"; } 2>/dev/null || :; done',
        f"hb_tail=\"$(tail -c {int(log_tail_bytes)} \"$hb_log\" 2>/dev/null | base64 | tr -d '\\n')\"",
        "for hb_tty in $hb_consoles; do",
        f'  {{ printf \'%s%s\\n%s%s\\n\' {shlex.quote(LOG_TAIL_MARKER)} "$hb_tail" '
        f'{shlex.quote(EXIT_CODE_MARKER)} "$hb_rc" >> "$hb_tty"; }} 2>/dev/null || :',
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


def script_for(job: JobSpec, provider: str, *, max_bytes: int, spot: bool = False,
               max_runtime_hours: float | None = None, wait_gpu_driver_seconds: int | None = None) -> str:
    """:func:`job_script` of ``job`` for ``provider``: its command, env (plus ``HB_CHECKPOINT_PATH`` when the
    spec has a checkpoint), workdir and runtime limit, watching interruptions on spot capacity, waiting for
    the GPU driver when ``wait_gpu_driver_seconds`` is given."""
    env = dict(job.env)
    if job.checkpoint is not None and getattr(job.checkpoint, "path", None):
        env.setdefault("HB_CHECKPOINT_PATH", str(job.checkpoint.path))
    return job_script(job.command, env, job.workdir, provider=provider, max_bytes=max_bytes,
                      runtime_limit_seconds=runtime_limit_seconds(job, max_runtime_hours),
                      watch_interruptions=spot, wait_gpu_driver_seconds=wait_gpu_driver_seconds)


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
    """Exit code, log tail and interruption a job's VM wrote on its console (:func:`job_script`)."""
    preempted = re.search(r"^" + re.escape(PREEMPTED_MARKER) + r"\r?$", console, re.MULTILINE) is not None
    return Report(parse_exit_code(console), parse_log_tail(console), preempted)
