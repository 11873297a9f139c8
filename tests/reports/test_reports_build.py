"""The report's figures, recomputed independently from the stored records."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

import broker.reports as reports
from broker.decisions import query_decisions, record_decision, record_outcome
from broker.model import Objective, PlacementOption, PlacementResult, Request, SpotPolicy
from broker.reports import build_report
from tests.reports.builders import T0, Decision, make_option, make_request, make_result, synthetic
from tests.reports.conftest import fill


def test_the_public_names_are_pinned() -> None:
    assert set(reports.__all__) == {
        "BASELINE_LABELS", "CSV_COLUMNS", "FORMATS", "SCHEMA_ID", "Baseline", "DailySpend", "DeadlineSummary",
        "EgressRow", "JobDecision", "OptionView", "Report", "ReportFilters", "SpendRow", "Summary", "WhatIf",
        "build_report", "load_records", "parse_when", "render", "render_csv", "render_html", "render_json",
        "report_from_store", "write_report",
    }


def _counted(rows: list[Any]) -> list[Any]:
    """Independent: the last placement of each job (by time, then id), oldest first."""
    last: dict[str, Any] = {}
    for r in sorted((r for r in rows if r.kind == "placement"), key=lambda r: (r.created_at, r.id)):
        last[r.job_id] = r
    return [r for r in last.values() if r.chosen is not None]


def _opts(r: Any) -> list[dict[str, Any]]:
    same = ("provider", "region", "zone", "instance_type", "capacity")
    return [r.chosen] + [a for a in r.alternatives if any(a[k] != r.chosen[k] for k in same)]


def test_savings_recomputed_from_the_stored_records_match_the_report(store_engine: Engine) -> None:
    fill(store_engine, synthetic(400, seed=11))
    with Session(store_engine) as s:
        rows = query_decisions(s)
    report = build_report(rows)
    placed = _counted(rows)
    broker = sum(r.chosen["total_usd"] for r in placed)
    assert report.summary.jobs_placed == len(placed)
    assert report.summary.estimated_spend_usd == pytest.approx(broker)

    # every figure from the baselines stored with each decision, summed by hand
    with_b = [r for r in placed if r.baselines]
    assert 0 < len(with_b) < len(placed)  # the synthetic set has some records without baselines
    od = [(r.baselines["on-demand"]["total_usd"], r.chosen["total_usd"]) for r in with_b
          if r.baselines["on-demand"] is not None]
    ignore = sum(r.baselines["ignore-data"]["total_usd"] for r in with_b)
    broker_priced = sum(r.chosen["total_usd"] for r in with_b)
    regions = set.intersection(*(set(r.baselines["regions"]) for r in with_b))
    per_region = {reg: sum(r.baselines["regions"][reg] for r in with_b) for reg in regions}
    best_region = min(per_region, key=lambda k: (per_region[k], k))

    got = {b.key: b for b in report.baselines}
    assert got["on-demand"].cost_usd == pytest.approx(sum(t for t, _ in od))
    assert got["on-demand"].broker_usd == pytest.approx(sum(c for _, c in od))
    assert got["on-demand"].exact_jobs == len(od)
    assert got["ignore-data"].cost_usd == pytest.approx(ignore)
    assert got["single-region"].cost_usd == pytest.approx(per_region[best_region])
    assert got["single-region"].detail.startswith(best_region)
    for key in ("ignore-data", "single-region"):
        assert got[key].broker_usd == pytest.approx(broker_priced)
        assert got[key].exact_jobs == len(with_b)
    for b in report.baselines:
        assert b.jobs == len(placed)
        assert b.savings_usd == pytest.approx(b.cost_usd - b.broker_usd)
        assert b.savings_usd >= -1e-9  # the broker chose the cheapest option every time
        assert f"{len(placed) - len(with_b)} jobs recorded without baselines not counted" in b.detail


def test_spend_and_egress_add_up_to_the_records(store_engine: Engine) -> None:
    fill(store_engine, synthetic(200, seed=3))
    with Session(store_engine) as s:
        rows = query_decisions(s)
    report = build_report(rows)
    placed = _counted(rows)
    by_provider: dict[str, float] = defaultdict(float)
    moved = 0.0
    for r in placed:
        by_provider[r.chosen["provider"]] += r.chosen["total_usd"]
        dest = f"{r.chosen['provider']}:{r.chosen['region']}"
        moved += sum(d["size_gib"] for d in r.request["data"] if d["location"] != dest)
    assert {row.key: row.estimated_usd for row in report.by_provider} == pytest.approx(dict(by_provider))
    for group in (report.by_region, report.by_namespace, report.by_capacity):
        assert sum(row.estimated_usd for row in group) == pytest.approx(report.summary.estimated_spend_usd)
        assert sum(row.jobs for row in group) == len(placed)
    assert report.summary.data_moved_gib == pytest.approx(moved)
    assert sum(e.gib for e in report.egress) == pytest.approx(moved)
    assert sum(e.usd for e in report.egress) == pytest.approx(
        sum(r.chosen["egress_usd"] for r in placed if any(d["location"] != f"{r.chosen['provider']}:"
                                                           f"{r.chosen['region']}" for d in r.request["data"]))
    )


def test_a_job_placed_twice_counts_once_at_its_last_placement(store_engine: Engine) -> None:
    first = make_option("aws", "us-east-1", hourly=1.0)
    second = make_option("gcp", "us-central1", hourly=1.5)
    req = make_request("retry")
    fill(store_engine, [
        Decision("j1", "a", req, make_result(first), T0),
        Decision("j1", "a", req, make_result(second), T0 + timedelta(minutes=5)),
        Decision("j2", "a", req, make_result(first), T0, kind="preview"),
    ])
    with Session(store_engine) as s:
        report = build_report(query_decisions(s))
    assert (report.summary.jobs_placed, report.summary.previews) == (1, 1)
    assert report.summary.estimated_spend_usd == pytest.approx(second.total_usd)
    assert [d.chosen.provider for d in report.decisions if d.chosen] == ["gcp"]


def test_history_is_not_repriced_actual_spend_uses_the_stored_hourly_price(store_engine: Engine) -> None:
    option = make_option("aws", "us-east-1", hourly=2.0, hours=4.0, egress=3.0)
    fill(store_engine, [Decision("j1", "a", make_request("h", hours=4.0), make_result(option), T0)])
    with Session(store_engine) as s:
        record_outcome(s, "j1", 5.0, T0 + timedelta(hours=5))
        s.commit()
        report = build_report(query_decisions(s))
    assert report.summary.actual_spend_usd == pytest.approx(2.0 * 5.0 + 3.0)
    assert report.summary.finished_jobs == 1
    assert report.by_provider[0].actual_usd == pytest.approx(13.0)


WHY_CASES = [
    (make_option("azure", "westeurope", hourly=3.0, hours=2, egress=0.0),
     make_option("aws", "us-east-1", hourly=2.0, hours=2, egress=29.0),
     ["$6.00 = $6.00 compute + $0.00 egress", "beats the runner-up by $27.00", "$29.00 egress avoided",
      "despite $2.00 more compute"]),
    (make_option("gcp", "us-central1", hourly=1.0, hours=2, capacity="spot"),
     make_option("gcp", "us-east1", hourly=2.0, hours=2),
     ["$2.00 less compute", "spot capacity", "runner-up gcp us-east1"]),
    (make_option("aws", "us-east-1", hourly=1.0), None, ["the only feasible option of 100 offers considered"]),
    (None, None, ["nothing feasible among 100 offers (InsufficientVCPUs x100)"]),
]


@pytest.mark.parametrize(("chosen", "runner", "phrases"), WHY_CASES, ids=[
    "data gravity wins: the egress avoided is named",
    "a cheaper spot offer wins on compute",
    "a lone feasible option says so",
    "an unplaceable job names its rejection reasons",
])
def test_why_the_choice_won(
    chosen: PlacementOption | None, runner: PlacementOption | None, phrases: list[str], store_engine: Engine
) -> None:
    result = make_result(chosen, *([runner] if runner else []))
    fill(store_engine, [Decision("j1", "a", make_request(), result, T0)])
    with Session(store_engine) as s:
        (decision,) = build_report(query_decisions(s)).decisions
    for phrase in phrases:
        assert phrase in decision.why
    if chosen and runner:
        assert decision.margin_usd == pytest.approx(runner.total_usd - chosen.total_usd)


def test_a_faster_dearer_choice_says_what_the_time_bought(store_engine: Engine) -> None:
    fast = replace(make_option("aws", "us-east-1", hourly=4.0, hours=1.0), finish_hours=1.0)
    slow = replace(make_option("aws", "us-west-2", hourly=0.5, hours=1.0, transfer_hours=3.0), finish_hours=4.0)
    result = PlacementResult("t", fast, (fast, slow), 10, 2, {}, "v1")
    req = replace(make_request("t", hours=1.0), objective=Objective.TIME)
    fill(store_engine, [Decision("j1", "a", req, result, T0)])
    with Session(store_engine) as s:
        (d,) = build_report(query_decisions(s)).decisions
    assert "costs $2.00 more than the runner-up but finishes 3.0 h sooner" in d.why
    assert d.margin_usd == pytest.approx(slow.total_usd - fast.total_usd) and d.margin_usd < 0


def test_deadline_outcomes_count_predicted_and_actual(store_engine: Engine) -> None:
    ds = [
        Decision(f"j{i}", "a", make_request(f"d{i}", hours=2, deadline=T0 + timedelta(hours=h)),
                 make_result(make_option(hours=2)), T0)
        for i, h in enumerate([1, 3, 5])
    ]
    fill(store_engine, ds)
    with Session(store_engine) as s:
        record_outcome(s, "j1", 4.0, T0 + timedelta(hours=4))  # deadline +3 h: missed
        record_outcome(s, "j2", 2.0, T0 + timedelta(hours=2))  # deadline +5 h: met
        s.commit()
        dl = build_report(query_decisions(s)).deadlines
    assert (dl.jobs_with_deadline, dl.met_predicted, dl.finished, dl.met, dl.missed) == (3, 2, 2, 1, 1)
    assert dl.offers_too_slow == 3 * 3  # DeadlineMiss x3 in each record


# ---------------------------------------------------------------- what-if


class _Catalog:
    """A tiny catalog version: (provider, region, capacity, hourly) rows, and its locations."""

    def __init__(self, rows: list[tuple[str, str, str, float]]) -> None:
        self.rows = rows
        self.locations = [SimpleNamespace(provider=p, region=r) for p, r, _c, _h in rows]


def _cheapest(request: Request, catalog: _Catalog, egress: Any, *, top: int, now: Any, extra_offers: Any) -> Any:
    """A plain cheapest-offer placement honouring the spot policy and the provider allow-list."""
    best = None
    for p, r, cap, hourly in catalog.rows:
        if request.providers and p not in request.providers:
            continue
        if (cap == "spot") != (request.spot == SpotPolicy.REQUIRED) and request.spot != SpotPolicy.ALLOWED:
            continue
        o = make_option(p, r, hourly=hourly, hours=request.duration_hours, capacity=cap)
        if best is None or o.total_usd < best.total_usd:
            best = o
    return PlacementResult(request.name, best, (best,) if best else (), len(catalog.rows), int(best is not None))


def test_whatif_replaces_against_the_recorded_catalog_version(store_engine: Engine) -> None:
    versions = {
        "old": _Catalog([("aws", "us-east-1", "on-demand", 1.0), ("aws", "us-east-1", "spot", 0.25),
                         ("gcp", "us-central1", "on-demand", 1.2)]),
        "new": _Catalog([("aws", "us-east-1", "on-demand", 9.0), ("aws", "us-east-1", "spot", 9.0),
                         ("gcp", "us-central1", "on-demand", 9.0)]),
    }
    loaded: list[str] = []

    def load(version: str) -> _Catalog:
        loaded.append(version)
        return versions[version]

    option = make_option("aws", "us-east-1", hourly=1.0, hours=2)
    fill(store_engine, [Decision(f"j{i}", "a", make_request(f"w{i}", hours=2), make_result(option, version="old"),
                                 T0 + timedelta(minutes=i)) for i in range(4)])
    with Session(store_engine) as s:
        report = build_report(query_decisions(s), whatif_catalogs=load, egress=object(), place_fn=_cheapest)
    assert set(loaded) == {"old"}  # never today's catalog
    w = {x.key: x for x in report.whatif}
    assert w["spot-everywhere"].status == "ok"
    assert w["spot-everywhere"].whatif_usd == pytest.approx(4 * 0.25 * 2)
    assert w["spot-everywhere"].delta_usd == pytest.approx(4 * (0.5 - 2.0))
    assert w["exclude-aws"].whatif_usd == pytest.approx(4 * 1.2 * 2) and w["exclude-aws"].moved == 4


def test_whatif_without_catalogs_is_unavailable_and_says_why(store_engine: Engine) -> None:
    fill(store_engine, synthetic(20))
    with Session(store_engine) as s:
        report = build_report(query_decisions(s))
    assert report.whatif and all(w.status == "unavailable" and "catalog" in w.reason for w in report.whatif)
    assert report.deadlines.premium_usd is None


def test_whatif_samples_evenly_when_there_are_many_jobs() -> None:
    from broker.reports.whatif import sample_evenly

    assert sample_evenly(list(range(10)), 20) == list(range(10))
    assert sample_evenly(list(range(100)), 4) == [0, 25, 50, 75]
    assert sample_evenly(list(range(5)), 0) == []


def test_the_real_placement_engine_replaces_recorded_jobs_when_present(tmp_path: Any) -> None:
    placement = pytest.importorskip("policies.placement", reason="policies.placement is not written yet")
    pricing = pytest.importorskip("pricing")
    if not hasattr(placement, "place") or not hasattr(pricing, "CatalogStore"):
        pytest.skip("policies.placement.place / pricing.CatalogStore are not there yet")
    catalog = pricing.load_catalog()
    store = pricing.CatalogStore(tmp_path)
    version = store.save(catalog, "test")
    egress = pricing.egress.load_egress() if hasattr(pricing, "egress") else None
    req = make_request("real", hours=1.0)
    result = placement.place(req, store.load(version), egress, top=5, now=T0)
    assert result.placement is not None
    from sqlmodel import SQLModel, create_engine

    engine = create_engine(f"sqlite:///{tmp_path}/b.db")
    SQLModel.metadata.create_all(engine, tables=[SQLModel.metadata.tables["decision_records"]])
    with Session(engine) as s:
        record_decision(s, job_id="j", namespace="a", request=req, result=result, policy="cost",
                        catalog_version=version, now=T0)
        s.commit()
        report = build_report(query_decisions(s), whatif_catalogs=store)
    spot = {w.key: w for w in report.whatif}["spot-everywhere"]
    assert spot.status == "ok" and spot.whatif_usd <= spot.recorded_usd + 1e-9
