"""The outlier rule is one consistent gap rule: equal prices share a verdict, price levels are kept, a lone
price under half the next level and the median is flagged (with its spot twin), and ``check_offer`` and
``place`` agree on every row."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from broker.model import Capacity, SpotPolicy
from policies.placement import Outlier, check_offer, place
from pricing import Catalog, load_egress
from tests.pricing.catalog_builders import make_catalog, make_offer, make_request, real_catalog  # noqa: F401

NOW = datetime(2026, 6, 1, tzinfo=UTC)
EGRESS = load_egress()


def _flagged(cat: Catalog) -> set[tuple[str, str]]:
    return {(cat.offer(int(i)).region, cat.offer(int(i)).capacity.value) for i in np.flatnonzero(cat.outlier)}


def test_two_price_levels_within_2x_are_both_real_prices() -> None:
    # GCP's H100 GPU rows: one level in 2 regions (43.07), the rest about 2x dearer: none is an error
    prices = {"us-central1": 43.07, "us-west1": 43.07, "us-west4": 44.26, "us-east4": 87.83, "europe-west4": 111.8,
              "asia-east1": 101.7, "europe-west1": 96.7, "us-east5": 98.9}
    cat = make_catalog([make_offer(p, provider="gcp", region=r, name="a3-highgpu-8g") for r, p in prices.items()])
    assert _flagged(cat) == set()


def test_a_lone_price_below_a_gap_is_flagged_with_its_spot_twin_and_every_cheaper_row() -> None:
    prices = {"eastus": 0.30, "westus": 0.25, "westeurope": 0.35, "japaneast": 0.28, "newzealandnorth": 0.0449,
              "brazilsouth": 0.0449, "southindia": 0.001}
    offers = [make_offer(p, provider="azure", region=r, name="Standard_F4ams_v6") for r, p in prices.items()]
    offers.append(make_offer(0.01, provider="azure", region="newzealandnorth", name="Standard_F4ams_v6",
                             capacity=Capacity.SPOT))
    offers.append(make_offer(0.02, provider="azure", region="eastus", name="Standard_F4ams_v6",
                             capacity=Capacity.SPOT))
    cat = make_catalog(offers)
    # the gap is between 0.0449 and 0.25; equal prices (two regions at 0.0449) share the verdict
    assert _flagged(cat) == {("newzealandnorth", "on-demand"), ("brazilsouth", "on-demand"),
                             ("southindia", "on-demand"), ("newzealandnorth", "spot")}
    i = next(int(i) for i in np.flatnonzero(cat.outlier) if cat.offer(int(i)).region == "brazilsouth")
    why = cat.outlier_reason(i)
    assert "$0.0449/h" in why and "$0.2500/h" in why and "median of its 7 on-demand rows is $0.2500/h" in why
    assert cat.outlier_reason(int(np.flatnonzero(~cat.outlier)[0])) == ""


def test_check_offer_and_place_agree_on_every_row() -> None:
    offers = [make_offer(p, provider="azure", region=r, name="Standard_F4ams_v6", vcpus=4, memory_gib=32)
              for r, p in {"eastus": 0.30, "westus": 0.25, "newzealandnorth": 0.0449}.items()]
    offers.append(make_offer(0.01, provider="azure", region="newzealandnorth", name="Standard_F4ams_v6", vcpus=4,
                             memory_gib=32, capacity=Capacity.SPOT))
    cat = make_catalog(offers)
    req = make_request(vcpus=4, memory_gib=8, spot=SpotPolicy.ALLOWED)
    res = place(req, cat, EGRESS, now=NOW)
    verdicts = [check_offer(req, cat.offer(i), EGRESS, now=NOW) for i in range(len(cat))]
    assert sum(v.passed for v in verdicts) == res.feasible == 2
    assert sum(v.reason == Outlier for v in verdicts) == res.rejected[Outlier] == 2
    assert res.placement is not None and res.placement.hourly_usd == 0.25
    with_outliers = make_request(vcpus=4, memory_gib=8, spot=SpotPolicy.ALLOWED, include_outliers=True)
    assert all(check_offer(with_outliers, cat.offer(i), EGRESS, now=NOW).passed for i in range(len(cat)))


def test_h100_8_on_the_v8_catalog_is_not_dearer_than_its_cheapest_valid_row(real_catalog: Catalog) -> None:  # noqa: F811
    cat = real_catalog
    rows = cat.query(accelerator="H100", gpus=8, capacities=["on-demand"], include_outliers=True)
    gcp_a3 = [int(i) for i in rows if cat.type_names[cat.type_code[i]] in ("a3-highgpu-8g", "a3-edgegpu-8g")]
    # rows priced from the same GPU row and host price share a verdict
    by_price: dict[float, set[bool]] = {}
    for i in gcp_a3:
        by_price.setdefault(round(float(cat.hourly_usd[i]), 5), set()).add(bool(cat.outlier[i]))
    assert all(len(v) == 1 for v in by_price.values())
    valid = [i for i in rows if not cat.outlier[i]]
    cheapest = float(cat.hourly_usd[valid].min())
    res = place(make_request(vcpus=8, memory_gib=64, gpus=8, accelerator="H100"), cat, EGRESS, now=NOW)
    assert res.placement is not None
    assert res.placement.hourly_usd <= cheapest + 1e-9
    assert res.placement.hourly_usd == pytest.approx(43.06615)  # a3-highgpu-8g us-central1: 9.46006 + 33.60609
