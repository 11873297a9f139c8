"""``edge-agent``: enroll, run, install, status. argparse only (the agent has no server deps).

Errors print one line on stderr and exit non-zero (2: bad usage/input, 1: anything else)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from edge.agent.config import default_state_dir

    p = argparse.ArgumentParser(prog="edge-agent", description="hybrid-broker edge agent")
    p.add_argument("--state-dir", default=str(default_state_dir()),
                   help="state directory (default $HB_EDGE_HOME or ~/.hb-edge)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--version", action="version", version="%(prog)s " + sys.modules["edge.agent.config"].AGENT_VERSION)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("enroll", help="enroll this device with a one-time token")
    e.add_argument("--broker", required=True, help="broker HTTP URL, e.g. https://broker.example:8080")
    e.add_argument("--token", required=True, help="one-time token from `broker devices enroll-token`")
    e.add_argument("--device-id", default=None, help="device id (default <hostname>-<random>)")
    e.add_argument("--mqtt", default=None, help="MQTT host:port, overriding what the broker announces")
    e.add_argument("--ca-file", default="", help="CA bundle to verify an https broker URL")
    e.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="a label for placement (repeatable; the enrollment token's labels win)")
    sub.add_parser("run", help="connect and run tasks until stopped")
    i = sub.add_parser("install", help="write a systemd unit and state directory")
    i.add_argument("--root", default="/", help="install under this root (default /)")
    i.add_argument("--dry-run", action="store_true", help="print what would be written")
    sub.add_parser("status", help="connection, queue depths, running tasks")
    return p


def _fail(msg: str, code: int = 1) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


def _run(state_dir: str) -> int:
    from edge.agent.config import AgentConfig
    from edge.agent.runtime import Agent

    try:
        cfg = AgentConfig.load(state_dir)
    except FileNotFoundError:
        return _fail(f"{state_dir} is not enrolled. To fix: edge-agent enroll --broker URL --token T", 2)
    agent = Agent(cfg)

    def _stop(_sig: int, _f: FrameType | None) -> None:
        agent.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        agent.run()
    finally:
        agent.close()
    return 0


def _status(state_dir: str) -> int:
    from edge.agent.config import AgentConfig
    from edge.agent.store import Store

    try:
        cfg = AgentConfig.load(state_dir)
    except FileNotFoundError:
        return _fail(f"{state_dir} is not enrolled. To fix: edge-agent enroll --broker URL --token T", 2)
    st_path = Path(state_dir) / "status.json"
    status = json.loads(st_path.read_text()) if st_path.exists() else {}
    fresh = bool(status) and time.time() - float(status.get("updated", 0)) < 10
    store = Store(cfg.path("agent.db"))
    try:
        depth = store.depth()
        running = [t.task_id for t in store.tasks("running")]
        queued = [t.task_id for t in store.tasks("queued")]
    finally:
        store.close()
    print(f"device:     {cfg.device_id}")
    conn = "agent not running" if not fresh else "connected" if status.get("connected") else "not connected"
    print(f"mqtt:       {cfg.mqtt_host}:{cfg.mqtt_port} ({conn})")
    print(f"outbox:     {depth['outbox']} messages ({depth['results']} results, {depth['telemetry']} telemetry)")
    print(f"running:    {', '.join(running) or '-'}")
    print(f"queued:     {', '.join(queued) or '-'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.cmd == "enroll":
            import ssl

            from edge.agent.enroll import enroll

            ctx = ssl.create_default_context(cafile=args.ca_file) if args.ca_file else None
            bad = [a for a in args.label if "=" not in a]
            if bad:
                return _fail(f"--label {bad[0]}: not KEY=VALUE. To fix: e.g. --label zone=lab", 2)
            labels = dict(a.split("=", 1) for a in args.label)
            cfg = enroll(args.broker, args.token, args.state_dir, device_id=args.device_id, mqtt=args.mqtt,
                         ssl_context=ctx, http_ca_file=args.ca_file, labels=labels)
            print(f"enrolled as {cfg.device_id}; MQTT {cfg.mqtt_host}:{cfg.mqtt_port}; state in {cfg.state_dir}")
            return 0
        if args.cmd == "run":
            return _run(args.state_dir)
        if args.cmd == "status":
            return _status(args.state_dir)
        if args.cmd == "install":
            from edge.agent.install import install

            for line in install(args.root, dry_run=args.dry_run):
                print(line)
            return 0
    except (ValueError, RuntimeError, OSError) as exc:  # PkiError, EnrollError, file errors
        return _fail(str(exc), 2 if isinstance(exc, ValueError) else 1)
    return _fail(f"unknown command {args.cmd}", 2)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
