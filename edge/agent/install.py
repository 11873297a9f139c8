"""``edge-agent install``: a systemd unit, a state directory (0700), a task work directory and the
unprivileged user tasks run as (``hb-task``: no login, no home; it cannot read the state directory)."""

from __future__ import annotations

import pwd
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["install", "unit_text", "UNIT_NAME", "TASK_USER", "ensure_task_user"]

UNIT_NAME = "hb-edge-agent.service"
TASK_USER = "hb-task"


def ensure_task_user(name: str = TASK_USER) -> bool:
    """Create the system user ``name`` (no home, no login shell) unless it exists; True when created."""
    try:
        pwd.getpwnam(name)
        return False
    except KeyError:
        pass
    r = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise OSError(f"cannot create the task user {name!r}: {r.stderr.strip() or r.returncode}. "
                      "To fix: run edge-agent install as root")
    return True


def unit_text(exe: str, state_dir: str) -> str:
    """The systemd unit that runs ``edge-agent run`` with ``HB_EDGE_HOME=state_dir``, restarting forever."""
    return f"""[Unit]
Description=hybrid-broker edge agent
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
Environment=HB_EDGE_HOME={state_dir}
ExecStart={exe} run
Restart=always
RestartSec=5
KillMode=mixed
LimitNOFILE=65536
StateDirectory=hb-edge
NoNewPrivileges=true

[Install]
WantedBy=multi-user.target
"""


def install(root: str = "/", *, state_dir: str = "/var/lib/hb-edge", dry_run: bool = False) -> list[str]:
    """Write the unit under ``root/etc/systemd/system`` and create ``root/<state_dir>`` (0700).

    Returns the lines describing what was (or, with ``dry_run``, would be) done."""
    exe = shutil.which("edge-agent") or f"{sys.executable} -m edge.agent.cli"
    r = Path(root)
    unit = r / "etc/systemd/system" / UNIT_NAME
    state = r / state_dir.lstrip("/")
    work = state.with_name(state.name + "-tasks")
    actions = [f"write {unit}", f"create {state} (mode 0700)", f"create {work} (mode 0711, task directories)",
               f"create the system user {TASK_USER} (tasks run as it)" if Path(root) == Path("/") else
               f"(root is not /: create the user {TASK_USER} on the device itself)",
               f"then: edge-agent enroll --state-dir {state_dir} --broker URL --token T; "
               f"systemctl enable --now {UNIT_NAME}"]
    if dry_run:
        return [*actions, "--- unit ---", unit_text(exe, state_dir)]
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(unit_text(exe, state_dir))
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    state.chmod(0o700)
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o711)
    if Path(root) == Path("/"):
        ensure_task_user()
    return actions
