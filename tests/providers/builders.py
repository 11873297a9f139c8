"""Small builders for provider tests: offers, placement options, job specs, and a bounded wait."""

from __future__ import annotations

from typing import Any

from broker.model import (
    Capacity,
    Instance,
    InstanceState,
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


def wait_states(provider: Any, request_id: str, states: set[InstanceState], seconds: float = 30.0,
                poll: float = 0.1) -> list[Instance]:
    """Poll ``provider.instances()`` (bounded) until the request has instances and all are in ``states``."""
    import time

    from providers.base import TAG_REQUEST

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = provider.instances({TAG_REQUEST: request_id})
        if got and all(i.state in states for i in got):
            return list(got)
        time.sleep(poll)
    raise AssertionError(f"{request_id}: not all in {sorted(s.value for s in states)} after {seconds}s: "
                         f"{provider.instances({TAG_REQUEST: request_id})}")


def wait_ended(provider: Any, request_id: str, timeout: float = 30.0) -> Instance:
    """Poll ``provider.instances()`` (bounded, 50 ms apart) until the request's one instance has ended."""
    import time

    from providers.base import TAG_REQUEST

    deadline = time.monotonic() + timeout
    while True:
        [inst] = provider.instances({TAG_REQUEST: request_id})
        if inst.state in (InstanceState.SUCCEEDED, InstanceState.FAILED, InstanceState.TERMINATED):
            return inst
        assert time.monotonic() < deadline, f"instance still {inst.state} after {timeout}s"
        time.sleep(0.05)
