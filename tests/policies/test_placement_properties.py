"""Property tests: over random catalogs and requests, no chosen option ever violates a filter, and the
placement's total equals the minimum of a brute-force scan of every offer."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.model import Capacity, DataInput, Objective, Offer, Request, SpotPolicy
from policies.placement import place
from pricing import load_egress
from pricing.egress import GBIT_PER_GIB
from tests.pricing.catalog_builders import make_catalog, make_offer

NOW = datetime(2026, 6, 1, tzinfo=UTC)
EGRESS = load_egress()
PLACES = [("aws", "us-east-1"), ("aws", "eu-west-1"), ("gcp", "us-central1"), ("gcp", "europe-west4"),
          ("azure", "eastus"), ("azure", "westeurope")]
ACCS = [None, "T4", "A100"]

offers_st = st.lists(
    st.builds(
        lambda where, name, vcpus, mem, acc, gpus, arch, cap, price: make_offer(
            price, provider=where[0], region=where[1], name=f"t{name}", vcpus=vcpus, memory_gib=mem,
            gpus=gpus if acc else 0, accelerator=acc, arch=arch, capacity=cap),
        st.sampled_from(PLACES), st.integers(0, 12), st.sampled_from([1, 2, 4, 8, 16, 64]),
        st.sampled_from([1, 4, 16, 64, 256]), st.sampled_from(ACCS), st.sampled_from([1, 2, 4, 8]),
        st.sampled_from(["amd64", "arm64"]), st.sampled_from([Capacity.ON_DEMAND, Capacity.SPOT]),
        st.floats(0.01, 50, allow_nan=False),
    ),
    min_size=1, max_size=40,
)

requests_st = st.builds(
    lambda vcpus, mem, acc, gpus, arch, spot, cap, provs, regs, dur, nodes, data, obj, dl, outl: Request(
        name="prop", vcpus=vcpus, memory_gib=mem, accelerator=acc, gpus=gpus if acc else 0, arch=arch, spot=spot,
        max_hourly_usd=cap, providers=provs, regions=regs, duration_hours=dur, nodes=nodes, data=data,
        objective=obj, deadline=None if dl is None else NOW + timedelta(hours=dl), include_outliers=outl),
    st.sampled_from([0.5, 1, 2, 4, 8, 16]), st.sampled_from([0.5, 2, 8, 32, 128]), st.sampled_from(ACCS),
    st.integers(0, 8), st.sampled_from(["amd64", "arm64", "any"]), st.sampled_from(list(SpotPolicy)),
    st.one_of(st.none(), st.floats(0.05, 60)),
    st.sampled_from([(), ("aws",), ("gcp", "azure")]), st.sampled_from([(), ("eu-west-1", "europe-west4")]),
    st.floats(0.1, 20), st.integers(1, 4),
    st.lists(st.builds(lambda w, s: DataInput("u", f"{w[0]}:{w[1]}", s), st.sampled_from(PLACES),
                       st.floats(0, 3000)), max_size=2).map(tuple),
    st.sampled_from(list(Objective)), st.one_of(st.none(), st.floats(0.1, 30)), st.booleans(),
)


def _ok(o: Offer, r: Request, outlier: bool) -> bool:
    it = o.instance_type
    return (
        (not r.providers or o.provider in r.providers)
        and (not r.regions or o.region in r.regions)
        and (r.spot != SpotPolicy.NEVER or o.capacity != Capacity.SPOT)
        and (r.spot != SpotPolicy.REQUIRED or o.capacity == Capacity.SPOT)
        and (r.arch == "any" or it.arch == r.arch)
        and (not r.accelerator or (it.accelerator or "").upper() == r.accelerator.upper())
        and it.vcpus >= r.vcpus and it.memory_gib >= r.memory_gib
        and it.gpus >= max(r.gpus, 1 if r.accelerator else 0)
        and (r.max_hourly_usd is None or o.hourly_usd <= r.max_hourly_usd)
        and (r.include_outliers or not outlier)
    )


def _cost(o: Offer, r: Request) -> tuple[float, float]:
    dst = o.location.key
    hours = sum(0.0 if d.location == dst else d.size_gib * GBIT_PER_GIB / EGRESS.gbps(d.location, dst) / 3600
                for d in r.data)
    egress = sum(EGRESS.egress_usd(d.location, dst, d.size_gib) for d in r.data)
    compute = o.hourly_usd * r.nodes * (r.duration_hours + hours)
    if o.capacity == Capacity.SPOT:  # expected interruption cost: default band 5-10%/month, midpoint 7.5%
        compute *= 1 + r.nodes * (-math.log(1 - 0.075) / 730) * ((r.duration_hours + hours) / 2 + 0.1)
    return compute + egress, hours + r.duration_hours


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(offers=offers_st, req=requests_st, step=st.sampled_from([1, 3, 1024]))
def test_filters_are_never_violated_and_the_best_matches_brute_force(
    offers: list[Offer], req: Request, step: int
) -> None:
    import policies.placement.engine as engine

    cat = make_catalog(offers)
    saved = engine._SCAN_STEP, engine._CANDIDATES
    engine._SCAN_STEP, engine._CANDIDATES = step, max(1, step)  # small windows exercise the scan's bound
    try:
        res = place(req, cat, EGRESS, now=NOW, top=5)
    finally:
        engine._SCAN_STEP, engine._CANDIDATES = saved
    all_offers = cat.offers(range(len(cat)))
    feasible = []
    for i, o in enumerate(all_offers):
        if not _ok(o, req, bool(cat.outlier[i])):
            continue
        total, finish = _cost(o, req)
        if req.deadline is not None and finish > (req.deadline - NOW).total_seconds() / 3600 + 1e-9:
            continue
        feasible.append((o, total, finish))
    assert res.feasible == len(feasible)
    assert res.considered == res.feasible + sum(res.rejected.values())
    if not feasible:
        assert res.placement is None and res.alternatives == ()
        return
    assert res.placement is not None
    by_key = {(o.provider, o.region, o.location.zone, o.instance_type.name, o.capacity.value): (o, t, f)
              for o, t, f in feasible}
    for opt in (res.placement, *res.alternatives):
        hit = by_key.get((opt.provider, opt.region, opt.zone, opt.instance_type, opt.capacity))
        assert hit is not None, f"{opt} is not a feasible offer"
        assert opt.total_usd == hit[1] or abs(opt.total_usd - hit[1]) <= 1e-9 * max(1.0, hit[1])
    if req.objective == Objective.COST:
        best = min(t for _, t, _ in feasible)
        assert abs(res.placement.total_usd - best) <= 1e-9 * max(1.0, best)
        # diversity: the first option of each distinct region are the cheapest rows of the cheapest regions
        per_region: dict[str, float] = {}
        for o, t, _ in feasible:
            per_region[o.location.key] = min(t, per_region.get(o.location.key, float("inf")))
        firsts: dict[str, float] = {}
        for opt in (res.placement, *res.alternatives):
            firsts.setdefault(f"{opt.provider}:{opt.region}", opt.total_usd)
        expect = sorted(per_region.values())[: len(firsts)]
        assert len(firsts) == min(6, len(per_region))
        assert all(abs(a - b) <= 1e-9 * max(1.0, b) for a, b in zip(firsts.values(), expect, strict=True))
        assert len(res.alternatives) == min(5, len(feasible) - 1) or len(res.alternatives) == 5
    else:
        best_f = min(round(f * 3600) for _, _, f in feasible)
        assert round(res.placement.finish_hours * 3600) == best_f


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(offers=offers_st, req=requests_st, wait=st.sampled_from([0.0, 0.5]))
def test_a_request_places_like_its_equivalent_request(offers: list[Offer], req: Request, wait: float) -> None:
    """``deadline.equivalent_request`` (what the scheduler caches placements by) changes neither the placement
    nor its savings baselines, with or without extra offers."""
    from dataclasses import replace

    from policies.placement.deadline import equivalent_request

    cat = make_catalog(offers)
    extra = [make_offer(0.2, provider="onprem", region="dc1", name="h1", vcpus=64, memory_gib=256)]
    same = equivalent_request(req, NOW, wait)
    assert same.deadline is None or same == req
    assert replace(same, deadline=req.deadline) == req
    for ex in ((), extra):
        a = place(req, cat, EGRESS, now=NOW, wait_hours=wait, extra_offers=ex, baselines=True)
        b = place(same, cat, EGRESS, now=NOW, wait_hours=wait, extra_offers=ex, baselines=True)
        assert a == b
