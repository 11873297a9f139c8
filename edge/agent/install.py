"""``edge-agent install``: a systemd unit and a config directory for the agent."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

__all__ = ["install", "unit_text", "UNIT_NAME"]

UNIT_NAME = "hb-edge-agent.service"


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
    actions = [f"write {unit}", f"create {state} (mode 0700)",
               f"then: edge-agent enroll --state-dir {state_dir} --broker URL --token T; "
               f"systemctl enable --now {UNIT_NAME}"]
    if dry_run:
        return [*actions, "--- unit ---", unit_text(exe, state_dir)]
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(unit_text(exe, state_dir))
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    return actions
