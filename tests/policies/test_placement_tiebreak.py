"""``objective: time`` (and ``cost``) rank candidates by every key exactly: a cheaper option that finishes at the
same second is never lost to a partition on the first key alone."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

import policies.placement.engine as engine
from broker.model import Objective
from policies.placement import place
from pricing import load_egress
from pricing.inventory import Link, Site
from tests.pricing.catalog_builders import data, make_catalog, make_offer, make_request

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def test_top_k_keeps_the_best_of_the_rows_tied_at_the_boundary() -> None:
    finish = np.array([5.0, 5.0, 5.0, 5.0, 3.0])
    total = np.array([9.0, 8.0, 1.0, 7.0, 20.0])
    rows = np.arange(5)
    got = engine._top_k((finish, total), rows, 2)
    assert sorted(got.tolist()) == [2, 4]  # the earliest finish, then the cheapest of the four tied at 5 h
    same = engine._top_k((np.zeros(4), np.array([3.0, 3.0, 1.0, 2.0])), rows[:4], 3)
    assert sorted(same.tolist()) == [0, 2, 3]  # full ties go to the lower catalog row, as the final sort does


@pytest.mark.parametrize("candidates", [1, 2, 256])
def test_time_objective_picks_the_cheapest_of_equal_finishes(monkeypatch: pytest.MonkeyPatch, candidates: int) -> None:
    # Data on an own site linked to three regions at the same bandwidth: all finish at the same second, but
    # moving the data to two of them costs $0.50/GiB and to the third nothing. The third is dearer per hour.
    lab = Site("lab", links=(Link("aws:us-east-1", 1.0, 0.5), Link("aws:us-west-2", 1.0, 0.5),
                             Link("aws:eu-west-1", 1.0, 0.0)))
    eg = load_egress(sites=[lab])
    cat = make_catalog([
        make_offer(1.00, region="us-east-1", name="m.large"),
        make_offer(1.01, region="us-west-2", name="m.large"),
        make_offer(1.20, region="eu-west-1", name="m.large"),
    ])
    req = make_request(vcpus=1, memory_gib=1, duration_hours=1, data=(data("onprem:lab", 100),),
                       objective=Objective.TIME)
    monkeypatch.setattr(engine, "_CANDIDATES", candidates)
    res = place(req, cat, eg, now=NOW, top=1)
    assert res.placement is not None
    options = [res.placement, *res.alternatives]
    assert len({round(o.finish_hours * 3600) for o in options}) == 1  # a true tie on the objective
    assert res.placement.region == "eu-west-1"
    assert res.placement.total_usd < min(o.total_usd for o in options[1:])
