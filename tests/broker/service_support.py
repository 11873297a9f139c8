"""Builders for the service tests: settings, apps, job documents, a real server in a thread."""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ADMIN = "hb_admin_test_token"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}

# A deterministic on-prem pool: one local host (runs commands for real) with 2 vCPUs and 4 GiB.
INVENTORY_YAML = """\
sites:
  - {name: local, continent: eu, uplink_gbps: 1}
hosts:
  - {name: localhost, site: local, vcpus: 2, memory_gib: 4, gpus: 0, owned_usd_per_hour: 0, local: true}
"""


@functools.lru_cache(maxsize=1)
def catalog() -> Any:
    import pricing

    return pricing.load_catalog(None)


def write_inventory(directory: Path) -> Path:
    path = directory / "inventory.yaml"
    path.write_text(INVENTORY_YAML)
    return path


def make_settings(tmp_path: Path, store_url: str, **overrides: Any) -> Any:
    from broker.config import load_settings

    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "database_url": store_url,
        "admin_token": ADMIN,
        "scheduler_enabled": False,
        "inventory": write_inventory(tmp_path),
        "providers": ("onprem", "aws"),
        "dry_run_speedup": 1.0,  # dry-run jobs take their estimated time on the test's clock
    }
    values.update(overrides)
    return load_settings({}, **values)


def make_app(tmp_path: Path, store_url: str, *, providers: Mapping[str, Any] | None = None, clock: Any = None,
             **overrides: Any) -> Any:
    """A broker app on ``store_url`` with the embedded catalog, the test inventory and ``providers``
    (default: the on-prem pool and a FakeProvider named ``aws``)."""
    import pricing
    from broker.app import create_app
    from providers.fake import FakeProvider
    from providers.onprem import OnPremPool

    settings = make_settings(tmp_path, store_url, **overrides)
    inventory = pricing.load_inventory(settings.inventory)
    egress = pricing.load_egress(None, sites=inventory.sites)
    if providers is None:
        providers = {
            "onprem": OnPremPool(inventory, settings.data_dir, clock=clock),
            "aws": FakeProvider("aws"),
        }
    return create_app(settings, clock=clock, providers=providers, catalog=catalog(), egress=egress)


def job_doc(
    name: str = "job-1",
    *,
    cpu: str = "1",
    memory: str = "1Gi",
    command: list[str] | None = None,
    hours: float = 0.01,
    labels: Mapping[str, str] | None = None,
    providers: list[str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A valid job spec document."""
    body: dict[str, Any] = {
        "command": command or ["true"],
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
        "durationHours": hours,
    }
    if providers is not None:
        body["placement"] = {"providers": providers}
    body.update(spec)
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "hybrid-broker/v1", "kind": "Job", "metadata": meta, "spec": body}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Run ``app`` under a real uvicorn on a free loopback port; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
