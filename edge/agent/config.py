"""The agent's configuration (``agent.yaml`` in its state directory) and the files it keeps there.

State directory layout: ``agent.yaml``, ``device.key`` (0600, generated on the device, never sent),
``device.pem``, ``ca.pem``, ``gateway.pem`` (verifies downlinks), ``agent.db`` (outbox/inbox),
``status.json`` (written by ``run`` for ``status``). Task working directories are ``<work_dir>/<task id>/``,
outside the state directory (default: the sibling ``<state dir>-tasks``), and tasks run as ``task_user``
(created by ``edge-agent install``; empty = as the agent itself, which then lets tasks read ``device.key``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

__all__ = ["AgentConfig", "default_state_dir", "AGENT_VERSION"]

AGENT_VERSION = "0.1.0"


def default_state_dir() -> Path:
    """``$HB_EDGE_HOME``, else ``~/.hb-edge``."""
    env = os.environ.get("HB_EDGE_HOME")
    return Path(env) if env else Path.home() / ".hb-edge"


@dataclass(frozen=True)
class AgentConfig:
    """What ``edge-agent run`` needs. Durations in seconds; ``window`` is the number of uplink messages
    that may await the gateway's acknowledgement at once (end-to-end flow control)."""

    state_dir: str
    device_id: str = ""
    broker_url: str = ""
    mqtt_host: str = "127.0.0.1"
    mqtt_port: int = 8883
    heartbeat_seconds: float = 30.0
    capacity_seconds: float = 600.0
    renew_check_seconds: float = 3600.0
    telemetry_cap: int = 1000
    window: int = 2000
    reconnect_max_seconds: int = 30  # reconnect backoff doubles from 1 s up to this
    retransmit_seconds: float = 15.0  # re-send unacknowledged messages when no ack came for this long
    max_parallel_tasks: int = 0  # 0 = number of CPUs
    http_ca_file: str = ""  # CA bundle for an https broker_url; empty = system default
    task_user: str = "hb-task"  # tasks run as this user when the agent is root; "" = as the agent
    restart_backoff_seconds: float = 10.0  # a task whose liveness probe failed restarts after this, doubling
    work_dir: str = ""  # task working directories; "" = <state_dir>-tasks (never inside the state dir)

    @property
    def dir(self) -> Path:
        return Path(self.state_dir)

    def path(self, name: str) -> Path:
        return self.dir / name

    @property
    def work_root(self) -> Path:
        """Where task working directories go: ``work_dir``, else ``<state dir>-tasks`` beside the state dir."""
        if self.work_dir:
            return Path(self.work_dir)
        d = self.dir.resolve()
        return d.with_name(d.name + "-tasks")

    @classmethod
    def load(cls, state_dir: str | Path) -> AgentConfig:
        """Read ``agent.yaml``; raises ``FileNotFoundError`` when the device is not enrolled yet."""
        p = Path(state_dir) / "agent.yaml"
        raw: dict[str, Any] = yaml.safe_load(p.read_text()) or {}
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in raw.items() if k in known}
        data["state_dir"] = str(state_dir)
        return cls(**data)

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        data = asdict(self)
        data.pop("state_dir")
        self.path("agent.yaml").write_text(yaml.safe_dump(data, sort_keys=True))
