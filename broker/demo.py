"""``python -m broker.demo`` (what ``make demo`` runs): the whole main job in under a minute.

Starts the broker on embedded defaults in a temporary data directory (SQLite, the bundled catalog, the
on-prem ``localhost`` pool, clouds in dry-run mode because no credentials exist), submits a burst of the
``examples/*.yaml`` jobs, follows them to completion with a progress bar, prints a summary table (where
each job ran, whether it was simulated, what it cost), writes the placement report when the reports module
exists, and stops the broker. Dry-run durations run on a fast clock (``--speedup``) so hours take seconds.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "run_demo"]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# Examples the demo leaves out: the preemption walkthrough runs ~30 s from the repository root by design.
SKIP: frozenset[str] = frozenset()  # examples that cannot run as they are (none now)


def _load_examples(directory: Path) -> list[dict[str, Any]]:
    from broker.errors import SpecError
    from broker.spec import load_documents, load_spec_file

    docs: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        if path.name in SKIP:
            continue
        try:
            load_spec_file(path)  # validate locally first: a broken example is skipped with its reason
            for doc in load_documents(path.read_bytes()):
                doc.get("metadata", {}).pop("namespace", None)  # the demo runs everything in team-a
                docs.append(doc)
        except SpecError as exc:
            print(f"demo: skipping {path.name}: {exc}", file=sys.stderr)
    return docs


def run_demo(examples: Path = EXAMPLES, *, speedup: float = 3600.0, timeout_seconds: float = 40.0,
             data_dir: Path | None = None) -> list[dict[str, Any]]:
    """Run the demo and return the final job summaries (see the module docstring)."""
    import threading

    import uvicorn
    from rich.console import Console
    from rich.table import Table

    from broker.app import create_app
    from broker.cli.service import follow
    from broker.client import BrokerClient
    from broker.config import load_settings

    console = Console(width=None if sys.stdout.isatty() else 170)
    with tempfile.TemporaryDirectory(prefix="hb-demo-") as tmp:
        root = Path(data_dir or tmp)
        admin = "hb_demo_" + secrets.token_hex(8)
        port = _free_port()
        settings = load_settings(
            {}, data_dir=root, admin_token=admin, port=port, dry_run_speedup=speedup,
            scheduler_interval_seconds=0.2,
        )
        started = time.monotonic()
        console.print(f"[bold]hybrid-broker demo[/] - data in {root}, store SQLite, clouds in dry-run mode")
        app = create_app(settings)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                               access_log=False, lifespan="on"))
        thread = threading.Thread(target=server.run, name="hb-demo-server", daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{port}"
        try:
            with BrokerClient(url, admin) as client:
                for _ in range(200):
                    if client.ready():
                        break
                    time.sleep(0.05)
                client.create_namespace("team-a")
                policies = examples / "policies" / "team-a.yaml"
                if policies.exists():  # the priority classes the examples name, and a soft budget
                    from broker.spec import load_documents

                    applied = client.apply_policies(load_documents(policies.read_bytes()))["applied"]
                    console.print(f"applied {len(applied)} policy documents from {policies}")
                docs = _load_examples(examples)
                answer = client.submit("team-a", docs)
                ids = [j["id"] for j in answer["jobs"]]
                console.print(f"submitted a burst of {len(ids)} jobs from {examples}")
                follow(client, "team-a", ids, timeout_seconds=timeout_seconds, poll_seconds=0.3)
                details = [client.get_job("team-a", i) for i in ids]
        finally:
            server.should_exit = True
            thread.join(timeout=30)
        table = Table(title="hybrid-broker demo: where each job ran")
        for col in ("job", "state", "where", "instance type", "capacity", "mode", "total USD", "why"):
            table.add_column(col, justify="right" if col == "total USD" else "left")
        for d in details:
            p = d.get("placement") or {}
            where = f"{p['provider']}:{p['region']}" if p else "-"
            mode = "dry-run" if d.get("dry_run") else ("real" if p else "-")
            why = next((e["reason"] for e in d["events"] if e["to"] == "PLACED"), d.get("message") or "")
            table.add_row(d["name"], d["state"], where, p.get("instance_type", "-"), p.get("capacity", "-"), mode,
                          f"{p['total_usd']:.4f}" if p else "-", (why or d.get("held_reason") or "")[:60])
        console.print(table)
        try:
            from broker.reports import write_report

            report = write_report(Path.cwd() / "artifacts" / "demo-report.html", "html",
                                  database_url=settings.effective_database_url, data_dir=root)
            console.print(f"placement report: {report}")
        except ImportError:
            pass
        except Exception as exc:  # noqa: BLE001 - the report is a bonus; the demo itself succeeded
            console.print(f"(placement report not written: {exc})")
        states = [d["state"] for d in details]
        console.print(f"{len(details)} jobs: " + ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))
                      + f"; broker stopped after {time.monotonic() - started:.1f}s")
        return details


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=Path, default=EXAMPLES, help="directory of job spec YAML files")
    parser.add_argument("--speedup", type=float, default=3600.0, help="dry-run clock factor (1 h -> 1 s)")
    args = parser.parse_args(argv)
    details = run_demo(args.examples, speedup=args.speedup)
    return 0 if details and all(d["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") for d in details) else 1


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    raise SystemExit(main())
