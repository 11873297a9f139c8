"""Burstable (CPU-credit / shared-core) types are never placed for sustained work unless the spec allows it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.errors import SpecError
from broker.model import SpotPolicy
from broker.spec import parse_job_spec as parse_spec
from policies.placement import BurstableType, check_offer, place
from policies.placement.burstable import is_burstable
from pricing import Catalog, load_egress
from tests.pricing.catalog_builders import make_catalog, make_offer, make_request, real_catalog  # noqa: F401

NOW = datetime(2026, 6, 1, tzinfo=UTC)
EGRESS = load_egress()


def _spec(placement: dict[str, object], cpu: object = 4) -> dict[str, object]:
    return {"apiVersion": "hybrid-broker/v1", "kind": "Job", "metadata": {"name": "sustained"},
            "spec": {"command": ["true"], "resources": {"requests": {"cpu": cpu, "memory": "8Gi"}}, "durationHours": 2,
                     "placement": placement}}


@pytest.mark.parametrize(("name", "burstable"), [
    ("t2.micro", True), ("t3.xlarge", True), ("t3a.2xlarge", True), ("t4g.medium", True),
    ("Standard_B4as_v2", True), ("Standard_B2ms", True), ("Standard_B16als_v2", True),
    ("e2-micro", True), ("e2-small", True), ("e2-medium", True), ("f1-micro", True),
    ("e2-standard-4", False), ("m5.xlarge", False), ("Standard_D4as_v5", False), ("trn1.2xlarge", False),
    ("Standard_DS2_v2", False), ("c7g.large", False),
])
def test_burstable_families_are_recognised_by_name(name: str, burstable: bool) -> None:
    assert is_burstable(name) is burstable


def test_a_whole_cpu_job_skips_the_cheaper_burstable_type_unless_allowed() -> None:
    cat = make_catalog([
        make_offer(0.15, provider="azure", region="eastus", name="Standard_B4as_v2", vcpus=4, memory_gib=16),
        make_offer(0.19, provider="azure", region="eastus", name="Standard_D4as_v5", vcpus=4, memory_gib=16),
    ])
    sustained = make_request(vcpus=4, memory_gib=8, duration_hours=2)
    res = place(sustained, cat, EGRESS, now=NOW)
    assert res.placement is not None and res.placement.instance_type == "Standard_D4as_v5"
    assert res.rejected == {BurstableType: 1}
    allowed = make_request(vcpus=4, memory_gib=8, duration_hours=2, allow_burstable=True)
    res2 = place(allowed, cat, EGRESS, now=NOW)
    assert res2.placement is not None and res2.placement.instance_type == "Standard_B4as_v2"
    # a fraction of a vCPU is not sustained work: the burstable type is fine
    small = make_request(vcpus=0.5, memory_gib=1)
    assert place(small, cat, EGRESS, now=NOW).placement.instance_type == "Standard_B4as_v2"  # type: ignore[union-attr]
    # check_offer agrees with place
    b_offer = cat.offer(0)
    assert check_offer(sustained, b_offer, EGRESS, now=NOW).reason == BurstableType
    assert check_offer(allowed, b_offer, EGRESS, now=NOW).passed


def test_the_spec_field_parses_and_rejects_nonsense() -> None:
    assert parse_spec(_spec({})).request.allow_burstable is False
    assert parse_spec(_spec({"burstable": "allowed"})).request.allow_burstable is True
    assert parse_spec(_spec({"burstable": "excluded"})).request.allow_burstable is False
    with pytest.raises(SpecError, match="burstable"):
        parse_spec(_spec({"burstable": "yes"}))


@pytest.mark.parametrize("spot", [SpotPolicy.NEVER, SpotPolicy.ALLOWED])
def test_on_the_real_catalog_no_sustained_job_lands_on_a_burstable_type(real_catalog: Catalog,  # noqa: F811
                                                                        spot: SpotPolicy) -> None:
    for vcpus, mem in ((1, 1), (2, 4), (4, 8), (4, 16), (8, 32)):
        res = place(make_request(vcpus=vcpus, memory_gib=mem, duration_hours=2, spot=spot), real_catalog, EGRESS,
                    now=NOW)
        picks = [res.placement, *res.alternatives]
        assert res.placement is not None
        assert not [p.instance_type for p in picks if p is not None and is_burstable(p.instance_type)]
        assert res.rejected.get(BurstableType, 0) > 0
    allowed = place(make_request(vcpus=2, memory_gib=4, allow_burstable=True, spot=spot), real_catalog, EGRESS,
                    now=NOW)
    assert BurstableType not in allowed.rejected
