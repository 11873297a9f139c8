"""Placement engine: brute-force equality, cost breakdown, data gravity, deadlines, objectives,
rejection counts, on-prem offers, diversity, explanations, bad requests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from broker.errors import SpecError
from broker.model import Capacity, Objective, PlacementOption, Request, SpotPolicy
from policies.placement import (
    REASONS,
    AcceleratorMismatch,
    DeadlineMiss,
    InsufficientVCPUs,
    OverPriceCap,
    check_offer,
    place,
)
from policies.placement import (
    SpotPolicy as SpotReason,
)
from pricing import Catalog, load_egress
from pricing.egress import GBIT_PER_GIB
from pricing.inventory import Site
from tests.pricing.catalog_builders import (  # noqa: F401
    data,
    make_catalog,
    make_offer,
    make_request,
    real_catalog,
    shared_core_rows,
    spot_risk_factor,
)

NOW = datetime(2026, 6, 1, tzinfo=UTC)
EGRESS = load_egress()


def _small_world() -> Catalog:
    return make_catalog([
        make_offer(1.00, region="us-east-1", name="m.4x", vcpus=4, memory_gib=16),
        make_offer(1.05, region="eu-west-1", name="m.4x", vcpus=4, memory_gib=16),
        make_offer(1.20, provider="gcp", region="europe-west4", name="n-4", vcpus=4, memory_gib=16),
        make_offer(0.40, region="us-east-1", name="m.4x", vcpus=4, memory_gib=16, capacity=Capacity.SPOT),
        make_offer(9.00, region="us-east-1", name="g.big", vcpus=32, memory_gib=128, gpus=4, accelerator="T4"),
        make_offer(0.50, region="us-east-1", name="tiny", vcpus=1, memory_gib=2),
    ])


def _independent_total(o: PlacementOption, req: Request) -> tuple[float, float, float]:
    """compute, egress, total for option ``o`` from the egress model's scalar functions."""
    dst = f"{o.provider}:{o.region}"
    hours = sum(0.0 if d.location == dst else d.size_gib * GBIT_PER_GIB / EGRESS.gbps(d.location, dst) / 3600
                for d in req.data)
    egress = sum(EGRESS.egress_usd(d.location, dst, d.size_gib) for d in req.data)
    compute = o.hourly_usd * req.nodes * (req.duration_hours + hours)
    if o.capacity == "spot":  # expected interruption cost, default band 5-10%/month (midpoint 7.5%)
        import math

        risk = compute * req.nodes * (-math.log(1 - 0.075) / 730) * ((req.duration_hours + hours) / 2 + 0.1)
        assert o.interruption_usd == pytest.approx(risk)
        return compute, egress, compute + egress + risk
    assert o.interruption_usd == 0.0
    return compute, egress, compute + egress


def test_compute_only_choice_equals_a_brute_force_scan_of_the_real_catalog(
    real_catalog: Catalog,  # noqa: F811
) -> None:
    cat = real_catalog
    cases = [
        make_request(vcpus=4, memory_gib=16, duration_hours=3),
        make_request(vcpus=64, memory_gib=512, gpus=8, accelerator="A100", spot=SpotPolicy.ALLOWED),
        make_request(vcpus=4, memory_gib=16, gpus=1, accelerator="T4", spot=SpotPolicy.REQUIRED),
        make_request(vcpus=8, memory_gib=32, regions=("eu-west-1", "europe-west4"), providers=("aws", "gcp")),
        make_request(vcpus=2, memory_gib=4, arch="arm64", max_hourly_usd=0.05),
        make_request(vcpus=16, memory_gib=64, nodes=4, duration_hours=0.5),
    ]
    for req in cases:
        res = place(req, cat, EGRESS, now=NOW)
        # brute force over the raw columns, written independently of the filter plugins
        locs = cat.locations
        prov = np.array([locs[c].provider for c in cat.loc_code])
        reg = np.array([locs[c].region for c in cat.loc_code])
        cap = np.array([c.value for c in (Capacity.ON_DEMAND, Capacity.SPOT, Capacity.RESERVED, Capacity.OWNED)])[
            cat.cap_code]
        acc = np.array([a.upper() for a in cat.accelerators])[cat.acc_code]
        ok = (cat.vcpus >= req.vcpus) & (cat.memory_gib >= req.memory_gib) & ~cat.outlier & ~shared_core_rows(cat)
        ok &= cat.gpus >= max(req.gpus, 1 if req.accelerator else 0)
        if req.accelerator:
            ok &= acc == req.accelerator.upper()
        if req.providers:
            ok &= np.isin(prov, req.providers)
        if req.regions:
            ok &= np.isin(reg, req.regions)
        if req.spot == SpotPolicy.NEVER:
            ok &= cap != "spot"
        if req.spot == SpotPolicy.REQUIRED:
            ok &= cap == "spot"
        if req.arch != "any":
            ok &= np.array(["amd64", "arm64"])[cat.arch_code] == req.arch
        if req.max_hourly_usd is not None:
            ok &= cat.hourly_usd <= req.max_hourly_usd
        # whole-vCPU requests are sustained work: no burstable (CPU-credit / shared-core) families
        ok &= ~shared_core_rows(cat)
        paid = req.nodes * req.duration_hours
        best = float((cat.hourly_usd * paid * spot_risk_factor(cat, req, req.duration_hours))[ok].min())
        assert res.placement is not None
        assert res.placement.total_usd == pytest.approx(best, rel=1e-9)
        assert res.feasible == int(ok.sum())
        assert res.considered == len(cat)
        assert res.considered == res.feasible + sum(res.rejected.values())


def test_totals_are_compute_plus_egress_computed_independently(real_catalog: Catalog) -> None:  # noqa: F811
    req = make_request(vcpus=8, memory_gib=32, duration_hours=2, nodes=2, spot=SpotPolicy.ALLOWED,
                       data=(data("aws:eu-west-1", 500), data("gcp:us-central1", 40)))
    res = place(req, real_catalog, EGRESS, now=NOW, top=5)
    assert res.placement is not None and len(res.alternatives) == 5
    for o in (res.placement, *res.alternatives):
        compute, egress, total = _independent_total(o, req)
        assert o.compute_usd == pytest.approx(compute)
        assert o.egress_usd == pytest.approx(egress)
        assert o.total_usd == pytest.approx(total)
    totals = [o.total_usd for o in (res.placement, *res.alternatives)]
    assert totals == sorted(totals)


@pytest.mark.parametrize(
    ("size_gib", "expected_region"),
    [(5000.0, "eu-west-1"), (1.0, "us-east-1")],
    ids=["a large dataset pulls the job to its region", "a small dataset does not move it"],
)
def test_data_gravity(size_gib: float, expected_region: str) -> None:
    req = make_request(vcpus=4, memory_gib=16, duration_hours=2, data=(data("aws:eu-west-1", size_gib),))
    res = place(req, _small_world(), EGRESS, now=NOW)
    assert res.placement is not None and res.placement.region == expected_region


def test_data_gravity_on_the_real_catalog(real_catalog: Catalog) -> None:  # noqa: F811
    far = place(make_request(vcpus=16, memory_gib=64, duration_hours=2, data=(data("azure:brazilsouth", 800),)),
                real_catalog, EGRESS, now=NOW)
    near = place(make_request(vcpus=16, memory_gib=64, duration_hours=2, data=(data("azure:brazilsouth", 0.01),)),
                 real_catalog, EGRESS, now=NOW)
    assert far.placement is not None and near.placement is not None
    assert (far.placement.provider, far.placement.region) == ("azure", "brazilsouth")
    assert (near.placement.provider, near.placement.region) != ("azure", "brazilsouth")


def test_a_deadline_that_cannot_be_met_rejects_and_says_why() -> None:
    req = make_request(vcpus=4, memory_gib=16, duration_hours=3, deadline=NOW + timedelta(hours=2))
    res = place(req, _small_world(), EGRESS, now=NOW)
    assert res.placement is None and res.rejected[DeadlineMiss] == res.considered - sum(
        v for k, v in res.rejected.items() if k != DeadlineMiss)
    assert DeadlineMiss in res.explanation
    assert res.to_dict()["placement"] is None


def test_deadline_counts_transfer_time_and_queue_wait() -> None:
    # 2000 GiB at eu-west-1: anywhere else needs hours of transfer; only eu-west-1 makes a 2.5 h deadline
    req = make_request(vcpus=4, memory_gib=16, duration_hours=2, deadline=NOW + timedelta(hours=2.5),
                       data=(data("aws:eu-west-1", 2000),))
    res = place(req, _small_world(), EGRESS, now=NOW)
    assert res.placement is not None and res.placement.region == "eu-west-1"
    assert res.rejected[DeadlineMiss] > 0
    late = place(req, _small_world(), EGRESS, now=NOW, wait_hours=1.0)
    assert late.placement is None


def test_objective_time_prefers_the_earlier_finish_over_the_cheaper_offer() -> None:
    cat = make_catalog([
        make_offer(0.10, region="us-east-1", name="cheap-far", vcpus=4, memory_gib=16),
        make_offer(3.00, provider="gcp", region="europe-west4", name="dear-near", vcpus=4, memory_gib=16),
    ])
    base = dict(vcpus=4, memory_gib=16, duration_hours=1, data=(data("gcp:europe-west4", 300),))
    by_cost = place(make_request(**base), cat, EGRESS, now=NOW)  # type: ignore[arg-type]
    by_time = place(make_request(objective=Objective.TIME, **base), cat, EGRESS, now=NOW)  # type: ignore[arg-type]
    assert by_cost.placement is not None and by_time.placement is not None
    assert by_time.placement.instance_type == "dear-near"
    assert by_time.placement.finish_hours < by_time.alternatives[0].finish_hours
    assert by_cost.placement.total_usd <= by_time.placement.total_usd
    assert "finishing in" in by_time.explanation or "wins" in by_time.explanation


@pytest.mark.parametrize(
    ("spot", "capacities"),
    [(SpotPolicy.NEVER, {"on-demand"}), (SpotPolicy.REQUIRED, {"spot"}),
     (SpotPolicy.ALLOWED, {"on-demand", "spot"})],
    ids=["never takes no spot", "required takes only spot", "allowed takes both"],
)
def test_spot_policy(spot: SpotPolicy, capacities: set[str]) -> None:
    res = place(make_request(vcpus=4, memory_gib=16, spot=spot), _small_world(), EGRESS, now=NOW, top=10)
    got = {o.capacity for o in (res.placement, *res.alternatives) if o is not None}
    assert got == capacities
    if spot != SpotPolicy.ALLOWED:
        assert res.rejected[SpotReason] >= 1


def test_rejections_are_counted_by_first_failing_reason() -> None:
    req = make_request(vcpus=2, memory_gib=4, max_hourly_usd=1.0)
    res = place(req, _small_world(), EGRESS, now=NOW)
    assert res.rejected == {"SpotPolicy": 1, InsufficientVCPUs: 1, OverPriceCap: 3}
    assert res.feasible == 1 and res.placement is not None and res.placement.instance_type == "m.4x"
    assert set(res.rejected) <= set(REASONS)


def test_on_prem_extra_offers_win_when_they_fit_and_hold_the_data() -> None:
    site = Site("rack-a", "onprem", "eu", uplink_gbps=1.0)
    egress = EGRESS.with_sites([site])
    own = make_offer(0.0, provider="onprem", region="rack-a", name="host-1", vcpus=8, memory_gib=32,
                     capacity=Capacity.OWNED)
    req = make_request(vcpus=4, memory_gib=16, data=(data("onprem:rack-a", 100),))
    res = place(req, _small_world(), egress, now=NOW, extra_offers=[own])
    assert res.placement is not None and res.placement.provider == "onprem"
    assert res.placement.capacity == "owned" and res.placement.total_usd == 0.0
    cloud = res.alternatives[0]
    assert cloud.transfer_hours > 0 and cloud.egress_usd == 0.0  # the site charges nothing to send
    too_big = place(make_request(vcpus=16, memory_gib=16), _small_world(), egress, now=NOW, extra_offers=[own])
    assert too_big.placement is not None and too_big.placement.provider != "onprem"


def test_alternatives_are_diverse_and_ranked(real_catalog: Catalog) -> None:  # noqa: F811
    res = place(make_request(vcpus=4, memory_gib=16), real_catalog, EGRESS, now=NOW, top=5)
    opts = [res.placement, *res.alternatives]
    assert all(o is not None for o in opts)
    regions = {(o.provider, o.region) for o in opts if o is not None}
    assert len(regions) == 6
    assert [o.total_usd for o in opts if o is not None] == sorted(o.total_usd for o in opts if o is not None)
    assert res.explanation.startswith(f"{res.placement.provider}:{res.placement.region}")  # type: ignore[union-attr]
    assert "runner-up" in res.explanation


@pytest.mark.parametrize(
    ("req", "field"),
    [
        (make_request(data=(data("aws:mars-north-1", 10),)), "spec.data[0].location"),
        (make_request(data=(data("onprem:nowhere", 10),)), "spec.data[0].location"),
    ],
    ids=["a cloud region that does not exist", "an unknown on-prem site"],
)
def test_bad_requests_raise_spec_errors_naming_the_field(req: Request, field: str) -> None:
    with pytest.raises(SpecError) as exc:
        place(req, _small_world(), EGRESS, now=NOW)
    assert exc.value.field == field


def test_an_accelerator_no_offer_carries_is_infeasible_not_an_error() -> None:
    res = place(make_request(accelerator="H200", gpus=8), _small_world(), EGRESS, now=NOW)
    assert res.placement is None and res.rejected[AcceleratorMismatch] > 0
    assert "AcceleratorMismatch" in res.explanation


def test_check_offer_gives_the_verdict_of_one_offer() -> None:
    o = make_offer(0.4, vcpus=4, memory_gib=16, capacity=Capacity.SPOT)
    assert check_offer(make_request(vcpus=4, memory_gib=16), o, EGRESS, now=NOW).reason == SpotReason
    assert check_offer(make_request(vcpus=4, memory_gib=16, spot=SpotPolicy.ALLOWED), o, EGRESS, now=NOW).passed
    gpu_req = make_request(gpus=1, accelerator="T4", spot=SpotPolicy.ALLOWED)
    assert check_offer(gpu_req, o, EGRESS, now=NOW).reason == AcceleratorMismatch
    late = make_request(vcpus=1, duration_hours=5, deadline=NOW + timedelta(hours=1), spot=SpotPolicy.ALLOWED)
    assert check_offer(late, o, EGRESS, now=NOW).reason == DeadlineMiss


def test_all_exports_are_pinned() -> None:
    import policies.placement as pp
    import pricing

    assert sorted(pricing.__all__) == sorted([
        "ARCHS", "CAPACITIES", "Catalog", "CatalogBuilder", "CatalogStore", "EgressModel", "Host", "Inventory",
        "Site", "cache_dir", "flag_outliers", "load_catalog", "load_egress", "load_embedded", "load_inventory",
        "load_skypilot_csv", "load_skypilot_dir",
    ])
    assert "place" in pp.__all__ and all(hasattr(pp, n) for n in pp.__all__)
    assert all(hasattr(pricing, n) for n in pricing.__all__)


@pytest.mark.parametrize(
    "req",
    [
        make_request(vcpus=8, memory_gib=32, duration_hours=2, data=(data("aws:eu-west-1", 500),)),
        make_request(vcpus=4, memory_gib=16, duration_hours=1, spot=SpotPolicy.ALLOWED,
                     data=(data("gcp:asia-east1", 50), data("azure:westeurope", 5))),
        make_request(vcpus=64, memory_gib=512, gpus=8, accelerator="A100", duration_hours=10,
                     data=(data("aws:us-east-1", 3000),)),
        make_request(vcpus=2, memory_gib=8, duration_hours=0.5, objective=Objective.TIME,
                     data=(data("gcp:us-central1", 200),)),
        make_request(vcpus=16, memory_gib=64, duration_hours=4, deadline=NOW + timedelta(hours=4.2),
                     data=(data("azure:eastus", 900),)),
    ],
    ids=["500 GiB in aws eu-west-1", "two inputs on two clouds with spot", "8xA100 next to 3 TB",
         "objective time with data", "a deadline only nearby regions can meet"],
)
def test_with_data_the_best_equals_a_brute_force_over_every_feasible_row(
    real_catalog: Catalog, req: Request  # noqa: F811
) -> None:
    cat = real_catalog
    res = place(req, cat, EGRESS, now=NOW, top=5)
    # per-location cost from the scalar egress functions, then every row (independent of the engine)
    loc_usd = np.array([sum(EGRESS.egress_usd(d.location, loc, d.size_gib) for d in req.data)
                        for loc in cat.locations])
    loc_h = np.array([sum(EGRESS.transfer_hours(d.location, loc, d.size_gib) for d in req.data)
                      for loc in cat.locations])
    ok = (cat.vcpus >= req.vcpus) & (cat.memory_gib >= req.memory_gib) & ~cat.outlier & ~shared_core_rows(cat)
    ok &= cat.gpus >= max(req.gpus, 1 if req.accelerator else 0)
    if req.accelerator:
        ok &= cat.acc_code == cat.accelerator_code(req.accelerator)
    if req.spot == SpotPolicy.NEVER:
        ok &= cat.cap_code != 1
    ok &= cat.arch_code == 0
    finish = req.duration_hours + loc_h[cat.loc_code]
    if req.deadline is not None:
        ok &= finish <= (req.deadline - NOW).total_seconds() / 3600
    paid_h = req.duration_hours + loc_h[cat.loc_code]
    total = cat.hourly_usd * req.nodes * paid_h * spot_risk_factor(cat, req, paid_h) + loc_usd[cat.loc_code]
    assert res.feasible == int(ok.sum())
    assert res.placement is not None
    if req.objective == Objective.COST:
        assert res.placement.total_usd == pytest.approx(float(total[ok].min()), rel=1e-9)
        # the alternatives are the cheapest row of the next-cheapest distinct regions
        best_per_loc: dict[int, float] = {}
        for i in np.flatnonzero(ok):
            key = int(cat.loc_code[i])
            if key not in best_per_loc or total[i] < best_per_loc[key]:
                best_per_loc[key] = float(total[i])
        expect = sorted(best_per_loc.values())[:6]
        seen: set[tuple[str, str]] = set()
        got = []
        for o in (res.placement, *res.alternatives):
            if (o.provider, o.region) not in seen:
                seen.add((o.provider, o.region))
                got.append(o.total_usd)
        assert got == pytest.approx(expect, rel=1e-9)
        assert len(res.alternatives) == 5  # filled with other offers when fewer regions qualify
    else:
        assert res.placement.finish_hours == pytest.approx(float(finish[ok].min()), abs=1e-3)


@pytest.mark.parametrize(
    ("interconnect", "expected"),
    [(None, "g.pcie8"), ("nvlink", "p3.16xlarge"), ("nvswitch", "p4d.24xlarge")],
    ids=["no interconnect asked takes the cheapest", "nvlink accepts nvlink (and nvswitch)",
         "nvswitch needs an nvswitch fabric"],
)
def test_interconnect(interconnect: str | None, expected: str) -> None:
    cat = make_catalog([
        make_offer(10.0, name="g.pcie8", vcpus=96, memory_gib=768, gpus=8, accelerator="V100"),
        make_offer(24.0, name="p3.16xlarge", vcpus=64, memory_gib=488, gpus=8, accelerator="V100"),
        make_offer(32.0, name="p4d.24xlarge", vcpus=96, memory_gib=1152, gpus=8, accelerator="V100"),
    ])
    res = place(make_request(gpus=8, interconnect=interconnect), cat, EGRESS, now=NOW)
    assert res.placement is not None and res.placement.instance_type == expected
    if interconnect:
        assert res.rejected.get("InterconnectMismatch", 0) >= 1
    unknown = place(make_request(gpus=8, interconnect="infiniband-9000"), cat, EGRESS, now=NOW)
    assert unknown.placement is None and unknown.rejected == {"InterconnectMismatch": 3}
