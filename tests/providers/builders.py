"""Small builders for provider tests: offers, placement options and job specs."""

from __future__ import annotations

from broker.model import (
    Capacity,
    InstanceType,
    JobSpec,
    Location,
    Offer,
    PlacementOption,
    Request,
    RetryPolicy,
)


def make_offer(
    provider: str = "fake",
    region: str = "r1",
    instance_type: str = "m.large",
    price: float = 1.0,
    vcpus: float = 2,
    memory_gib: float = 8,
    capacity: Capacity = Capacity.ON_DEMAND,
) -> Offer:
    return Offer(
        instance_type=InstanceType(instance_type, vcpus, memory_gib),
        location=Location(provider, region),
        capacity=capacity,
        hourly_usd=price,
    )


def make_option(
    provider: str = "fake",
    region: str = "r1",
    instance_type: str = "m.large",
    price: float = 1.0,
    capacity: str = "on-demand",
    zone: str | None = None,
    vcpus: float = 2,
    memory_gib: float = 8,
    site: str = "cloud",
) -> PlacementOption:
    return PlacementOption(
        provider=provider,
        region=region,
        zone=zone,
        instance_type=instance_type,
        capacity=capacity,
        vcpus=vcpus,
        memory_gib=memory_gib,
        gpus=0,
        accelerator=None,
        hourly_usd=price,
        compute_usd=price,
        egress_usd=0.0,
        transfer_hours=0.0,
        total_usd=price,
        site=site,
    )


def make_job(
    name: str = "job-1",
    command: tuple[str, ...] = (),
    vcpus: float = 1,
    memory_gib: float = 0.5,
    duration_hours: float = 1.0,
    env: dict[str, str] | None = None,
    retry: RetryPolicy | None = None,
) -> JobSpec:
    return JobSpec(
        name=name,
        request=Request(name=name, vcpus=vcpus, memory_gib=memory_gib, duration_hours=duration_hours),
        command=command,
        env=env or {},
        retry=retry or RetryPolicy(),
    )
