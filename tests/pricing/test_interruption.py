"""Spot expected cost includes interruption risk: from history when there is one, else a published band."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker.errors import SpecError
from broker.model import Capacity, SpotPolicy
from policies.placement import place
from pricing import load_egress
from pricing.interruption import band_rate, load_interruptions
from tests.pricing.catalog_builders import make_catalog, make_offer, make_request

NOW = datetime(2026, 6, 1, tzinfo=UTC)
EGRESS = load_egress()


def test_bands_are_monthly_shares_turned_into_hourly_rates() -> None:
    assert band_rate("<5%") == pytest.approx(-math.log(1 - 0.025) / 730)
    assert band_rate(">20%") == pytest.approx(-math.log(1 - 0.225) / 730)
    assert band_rate("5-10%") < band_rate("10-15%") < band_rate("15-20%")
    with pytest.raises(SpecError, match="not an interruption band"):
        band_rate("often")


def test_history_wins_over_a_band_and_bad_files_say_what_is_wrong(tmp_path: Path) -> None:
    f = tmp_path / "spot.yaml"
    f.write_text("locations:\n  aws:us-east-1: {spot_hours: 1000, interruptions: 5}\n"
                 "  azure:eastus: {band: '>20%'}\n")
    m = load_interruptions(f)
    assert m.rate("aws:us-east-1") == pytest.approx(5 / 1000)
    assert "history: 5 interruptions in 1000" in m.source("aws:us-east-1")
    assert m.rate("azure:eastus") == pytest.approx(band_rate(">20%"))
    assert m.rate("gcp:us-central1") == pytest.approx(band_rate("5-10%"))
    f.write_text("locations:\n  aws:us-east-1: {spot_hours: 0, interruptions: 5}\n")
    with pytest.raises(SpecError, match="spot_hours > 0"):
        load_interruptions(f)
    f.write_text("locations: [1, 2\n")
    with pytest.raises(SpecError, match="invalid YAML"):
        load_interruptions(f)


def test_a_spot_offer_with_a_bad_history_is_not_cheaper_on_paper_only(tmp_path: Path) -> None:
    cat = make_catalog([
        make_offer(0.30, region="us-east-1", name="m.large"),
        make_offer(0.10, region="us-east-1", name="m.large", capacity=Capacity.SPOT),
        make_offer(0.12, region="us-west-2", name="m.large", capacity=Capacity.SPOT),
    ])
    f = tmp_path / "spot.yaml"
    f.write_text("locations:\n  aws:us-east-1: {spot_hours: 100, interruptions: 5}\n")  # 1 in 20 hours
    risk = load_interruptions(f)
    req = make_request(vcpus=1, memory_gib=1, duration_hours=10, spot=SpotPolicy.ALLOWED)
    res = place(req, cat, EGRESS, now=NOW, risk=risk)
    assert res.placement is not None
    # us-east-1 spot: $1.00 of compute + 1.00 x 0.05 x (10/2 + 0.1) = $0.255 of expected rework -> $1.255;
    # us-west-2 spot (default band): $1.20 x (1 + rate x 5.1) -> about $1.2010; on-demand $3.00
    assert res.placement.region == "us-west-2"
    assert res.placement.total_usd == pytest.approx(1.20 * (1 + band_rate("5-10%") * 5.1))
    east = next(o for o in res.alternatives if o.region == "us-east-1" and o.capacity == "spot")
    assert east.interruption_usd == pytest.approx(1.0 * 0.05 * 5.1)
    assert east.total_usd == pytest.approx(east.compute_usd + east.egress_usd + east.interruption_usd)
    # a gang stops when any node is reclaimed: 4 nodes risk 4 x 4 as much per dollar of compute
    gang = place(make_request(vcpus=1, memory_gib=1, duration_hours=10, spot=SpotPolicy.REQUIRED, nodes=4), cat,
                 EGRESS, now=NOW, risk=risk)
    g = gang.placement
    assert g is not None and g.interruption_usd == pytest.approx(g.compute_usd * 4 * band_rate("5-10%") * 5.1)
    never = place(make_request(vcpus=1, memory_gib=1, duration_hours=10), cat, EGRESS, now=NOW, risk=risk)
    assert never.placement is not None and never.placement.interruption_usd == 0.0


def test_the_explanation_names_the_spot_risk_in_the_sum() -> None:
    cat = make_catalog([make_offer(2.0, region="us-east-1", name="g.big", capacity=Capacity.SPOT)])
    res = place(make_request(vcpus=1, memory_gib=1, duration_hours=100, spot=SpotPolicy.REQUIRED), cat, EGRESS,
                now=NOW)
    assert res.placement is not None
    risk = 200.0 * band_rate("5-10%") * (100 / 2 + 0.1)  # $200 of compute, half the run lost per interruption
    assert res.placement.interruption_usd == pytest.approx(risk)
    assert f"(compute $200.00 + egress $0.00 + spot interruption risk ${risk:,.2f})" in res.explanation
