"""Savings against each baseline equal a hand computation from the decisions: real placements over a small
catalog, recorded with the baselines placement stored, then reported."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from broker.decisions import query_decisions, record_decision
from broker.model import Capacity, SpotPolicy
from broker.reports import build_report
from policies.placement import place
from pricing import load_egress
from pricing.egress import GBIT_PER_GIB
from tests.pricing.catalog_builders import data, make_catalog, make_offer, make_request

NOW = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
EGRESS = load_egress()
# a spot run's expected interruption cost: default band 5-10%/month (midpoint 7.5%), half the run + 0.1 h lost
RATE = -math.log(1 - 0.075) / 730
SPOT_2H = 0.09 * 2 * (1 + RATE * (2 / 2 + 0.1))  # $0.18 of compute plus its risk


def _catalog():  # type: ignore[no-untyped-def]
    return make_catalog([
        make_offer(0.30, region="us-east-1", name="m.large"),
        make_offer(0.09, region="us-east-1", name="m.large", capacity=Capacity.SPOT),
        make_offer(0.20, region="eu-west-1", name="m.large"),
        make_offer(0.25, provider="gcp", region="us-central1", name="n.large"),
    ])


def test_every_baseline_is_the_hand_computed_sum_of_the_decisions(store_engine: Engine) -> None:
    cat = _catalog()
    spot_job = make_request("spot-job", vcpus=2, memory_gib=8, duration_hours=2, spot=SpotPolicy.ALLOWED)
    data_job = make_request("data-job", vcpus=2, memory_gib=8, duration_hours=1,
                            data=(data("gcp:us-central1", 100),))
    with Session(store_engine) as s:
        for i, req in enumerate((spot_job, data_job)):
            res = place(req, cat, EGRESS, now=NOW, baselines=True)
            record_decision(s, job_id=f"j{i}", namespace="team-a", request=req, result=res, policy="cost",
                            catalog_version=cat.version, now=NOW, kind="placement")
        s.commit()
        rows = query_decisions(s)
    report = build_report(rows)

    # By hand, from the four list prices. The spot job: 2 h on us-east-1 spot at $0.09 = $0.18 (SPOT_2H with
    # its interruption risk); on-demand it
    # would be eu-west-1 at $0.20 x 2 = $0.40; per region: us-east-1 $0.18, eu-west-1 $0.40, us-central1 $0.50.
    # The data job (100 GiB in gcp:us-central1): stays there, $0.25 x 1 h; moving it to eu-west-1 costs GCP's
    # internet egress and 100 GiB at 1 Gbit/s of paid transfer time.
    e = EGRESS.egress_usd("gcp:us-central1", "aws:eu-west-1", 100)
    assert e == pytest.approx(100 * EGRESS.usd_per_gib("gcp:us-central1", "aws:eu-west-1"))
    t = 100 * GBIT_PER_GIB / EGRESS.gbps("gcp:us-central1", "aws:eu-west-1") / 3600
    broker = SPOT_2H + 0.25
    assert report.summary.estimated_spend_usd == pytest.approx(broker)
    got = {b.key: b for b in report.baselines}
    assert got["on-demand"].cost_usd == pytest.approx(0.40 + 0.25)
    assert got["on-demand"].savings_usd == pytest.approx(0.40 + 0.25 - broker)
    # ignore data: the spot job has no data (its own choice); the data job goes to the cheapest compute
    assert got["ignore-data"].cost_usd == pytest.approx(SPOT_2H + 0.20 * (1 + t) + e)
    assert got["ignore-data"].savings_usd == pytest.approx(SPOT_2H + 0.20 * (1 + t) + e - broker)
    # single region: us-central1 ($0.50 + $0.25) beats us-east-1 and eu-west-1 (both pay the data job's egress)
    assert got["single-region"].detail.startswith("gcp:us-central1")
    assert got["single-region"].cost_usd == pytest.approx(0.50 + 0.25)
    assert got["single-region"].savings_usd == pytest.approx(0.50 + 0.25 - broker)
    for b in report.baselines:
        assert (b.exact_jobs, b.jobs) == (2, 2)
        assert b.broker_usd == pytest.approx(broker)


def test_a_spot_job_is_compared_with_its_on_demand_price_not_the_dearest_option() -> None:
    cat = _catalog()
    req = make_request("spot-job", vcpus=2, memory_gib=8, duration_hours=2, spot=SpotPolicy.REQUIRED)
    res = place(req, cat, EGRESS, now=NOW, baselines=True)
    assert res.placement is not None and res.placement.capacity == "spot"
    on_demand = res.baselines["on-demand"]
    assert on_demand.capacity == "on-demand" and on_demand.total_usd == pytest.approx(0.40)
    assert res.placement.interruption_usd == pytest.approx(0.18 * RATE * 1.1)
    assert res.baselines["regions"] == pytest.approx({"aws:us-east-1": SPOT_2H})  # spot required: only there
    assert place(req, cat, EGRESS, now=NOW).baselines == {}  # not asked: not computed
