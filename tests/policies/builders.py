"""Builders for the policies tests: ``make_workload(priority=5)``, ``make_option(total=3.0)``..."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from broker.model import PlacementOption
from policies.workload import Workload

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def at(seconds: float = 0.0) -> datetime:
    return T0 + timedelta(seconds=seconds)


def make_workload(
    id: str = "j1",
    *,
    namespace: str = "team-a",
    cpu: float = 1.0,
    memory: float = 2.0,
    gpus: float = 0.0,
    limits: dict[str, float] | None = None,
    created: float = 0.0,
    **kw: Any,
) -> Workload:
    requests = {"cpu": cpu, "memory": memory}
    if gpus:
        requests["gpu"] = gpus
    return Workload(id=id, namespace=namespace, created_at=at(created), requests=requests,
                    limits=limits or {}, **kw)


def make_option(
    provider: str = "aws",
    region: str = "us-east-1",
    *,
    total: float = 1.0,
    finish_hours: float = 1.0,
    instance_type: str = "m5.large",
    vcpus: float = 2,
    gpus: int = 0,
) -> PlacementOption:
    return PlacementOption(
        provider=provider, region=region, zone=None, instance_type=instance_type, capacity="on-demand",
        vcpus=vcpus, memory_gib=8, gpus=gpus, accelerator=None, hourly_usd=total, compute_usd=total,
        egress_usd=0.0, transfer_hours=0.0, total_usd=total, finish_hours=finish_hours,
    )
