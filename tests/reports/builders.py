"""Small builders for report tests: options, results, requests, and a synthetic decision generator."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from broker.model import DataInput, PlacementOption, PlacementResult, Request, SpotPolicy

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)

REGIONS = [
    ("aws", "us-east-1", "na"),
    ("aws", "eu-west-1", "eu"),
    ("azure", "westeurope", "eu"),
    ("azure", "eastus", "na"),
    ("gcp", "us-central1", "na"),
    ("gcp", "europe-west4", "eu"),
]


def make_option(
    provider: str = "aws",
    region: str = "us-east-1",
    *,
    hourly: float = 1.0,
    hours: float = 2.0,
    egress: float = 0.0,
    transfer_hours: float = 0.0,
    capacity: str = "on-demand",
    instance_type: str = "m5.2xlarge",
    site: str = "cloud",
    nodes: int = 1,
) -> PlacementOption:
    compute = hourly * nodes * (hours + transfer_hours)
    return PlacementOption(
        provider=provider,
        region=region,
        zone=None,
        instance_type=instance_type,
        capacity=capacity,
        vcpus=8,
        memory_gib=32,
        gpus=0,
        accelerator=None,
        hourly_usd=hourly,
        compute_usd=compute,
        egress_usd=egress,
        transfer_hours=transfer_hours,
        total_usd=compute + egress,
        site=site,
        finish_hours=hours + transfer_hours,
    )


def make_request(
    name: str = "job",
    *,
    hours: float = 2.0,
    data: tuple[tuple[str, float], ...] = (),
    spot: SpotPolicy = SpotPolicy.NEVER,
    deadline: datetime | None = None,
) -> Request:
    return Request(
        name=name,
        vcpus=8,
        memory_gib=32,
        duration_hours=hours,
        deadline=deadline,
        data=tuple(DataInput(f"s3://bucket/{name}/{i}", loc, gib) for i, (loc, gib) in enumerate(data)),
        spot=spot,
    )


def make_result(chosen: PlacementOption | None, *alts: PlacementOption, version: str = "cat-v1") -> PlacementResult:
    """A result whose alternatives are ranked by total, the choice first (as placement returns them)."""
    ranked = tuple(sorted(((chosen,) if chosen else ()) + alts, key=lambda o: o.total_usd))
    return PlacementResult(
        job="job",
        placement=chosen,
        alternatives=ranked,
        considered=100,
        feasible=len(ranked),
        rejected={"InsufficientVCPUs": 40, "DeadlineMiss": 3} if chosen else {"InsufficientVCPUs": 100},
        catalog_version=version,
    )


def synthetic_baselines(rng: random.Random, options: list[PlacementOption], hours: float) -> dict[str, Any]:
    """Baselines as placement stores them, consistent with ``options`` (ranked, the choice first): on-demand =
    the best non-spot option, or the choice's on-demand twin (price / 0.35), or none; ignore-data = the option
    cheapest on compute; regions = every cloud region, the options' totals where they are, dearer elsewhere."""
    nonspot = [o for o in options if o.capacity != "spot"]
    if nonspot:
        on_demand: PlacementOption | None = nonspot[0]
    elif rng.random() < 0.8:
        c = options[0]
        on_demand = make_option(c.provider, c.region, hourly=round(c.hourly_usd / 0.35, 4), hours=hours,
                                egress=c.egress_usd, transfer_hours=c.transfer_hours)
    else:
        on_demand = None
    ignore = min(options, key=lambda o: (o.compute_usd, o.total_usd))
    regions = {f"{p}:{r}": round(options[-1].total_usd * rng.uniform(1.0, 1.5), 4) for p, r, _ in REGIONS}
    for o in reversed(options):
        if o.site == "cloud":
            regions[f"{o.provider}:{o.region}"] = o.total_usd
    return {"on-demand": on_demand, "ignore-data": ignore, "regions": regions}


@dataclass(frozen=True)
class Decision:
    job_id: str
    namespace: str
    request: Request
    result: PlacementResult
    at: datetime
    kind: str = "placement"


def synthetic(n: int, *, seed: int = 7, start: datetime = T0, alternatives: int = 4) -> Iterator[Decision]:
    """``n`` varied decisions over a few days: several namespaces, spot and on-demand, data in
    different regions, some deadlines, a few unplaceable jobs and previews, ranked by total."""
    rng = random.Random(seed)
    for i in range(n):
        hours = rng.choice([0.5, 1, 2, 4, 8])
        data_loc = rng.choice(REGIONS)
        gib = rng.choice([0, 0, 10, 200, 800])
        spot = rng.choice([SpotPolicy.NEVER, SpotPolicy.ALLOWED, SpotPolicy.ALLOWED])
        deadline = start + timedelta(hours=rng.choice([6, 12, 48])) if rng.random() < 0.3 else None
        req = make_request(
            f"job-{i}", hours=hours, data=((f"{data_loc[0]}:{data_loc[1]}", float(gib)),) if gib else (),
            spot=spot, deadline=deadline,
        )
        options = []
        for provider, region, _cont in rng.sample(REGIONS, k=min(len(REGIONS), alternatives + 1)):
            hourly = round(rng.uniform(0.2, 3.0), 4)
            local = (provider, region) == data_loc[:2]
            egress = 0.0 if local or not gib else round(gib * rng.choice([0.02, 0.05, 0.09]), 4)
            capacity = "spot" if spot != SpotPolicy.NEVER and rng.random() < 0.5 else "on-demand"
            if capacity == "spot":
                hourly = round(hourly * 0.35, 4)
            options.append(make_option(provider, region, hourly=hourly, hours=hours, egress=egress,
                                       capacity=capacity, transfer_hours=0.0 if local else gib / 1000))
        if rng.random() < 0.1:
            options.append(make_option("onprem", "rack-a", hourly=0.05, hours=hours, capacity="owned",
                                       site="onprem", instance_type="localhost"))
        options.sort(key=lambda o: o.total_usd)
        unplaceable = rng.random() < 0.03
        chosen = None if unplaceable else options[0]
        result = make_result(chosen, *([] if unplaceable else options[1:]), version=f"cat-v{1 + i % 2}")
        if chosen is not None and rng.random() < 0.95:  # a few records predate stored baselines
            result = replace(result, baselines=synthetic_baselines(rng, options, hours))
        at = start + timedelta(minutes=7 * i)
        kind = "preview" if rng.random() < 0.05 else "placement"
        yield Decision(f"j{i}", rng.choice(["team-a", "team-b", "ml"]), req, result, at, kind)
