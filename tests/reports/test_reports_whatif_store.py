"""The broker keeps the catalog version it places against, so a report over its store has the What-if and
deadline-premium sections (what `make demo` writes) instead of "unavailable"."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from broker import decisions
from broker.app import create_app
from broker.clock import ManualClock
from broker.config import load_settings
from broker.model import Capacity, SpotPolicy
from broker.reports import report_from_store
from pricing import CatalogStore, load_egress
from tests.pricing.catalog_builders import make_catalog, make_offer, make_request

NOW = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


def test_a_report_over_the_broker_store_has_what_if_and_the_deadline_premium(tmp_path: Path) -> None:
    cat = make_catalog([
        make_offer(0.30, region="us-east-1", name="m.large"),
        make_offer(0.09, region="us-east-1", name="m.large", capacity=Capacity.SPOT),
        make_offer(0.20, provider="gcp", region="us-central1", name="n.large"),
    ])
    settings = load_settings({}, data_dir=tmp_path, admin_token="hb_test_" + "a" * 16, providers="")
    app = create_app(settings, clock=ManualClock(NOW), catalog=cat, egress=load_egress())
    hb = app.state.hb
    assert CatalogStore(tmp_path).load(cat.version).version == cat.version  # kept at start
    jobs = [make_request("plain", vcpus=2, memory_gib=4, duration_hours=2),
            make_request("deadline", vcpus=2, memory_gib=4, duration_hours=1, deadline=NOW + timedelta(hours=3)),
            make_request("spot-ok", vcpus=2, memory_gib=4, duration_hours=1, spot=SpotPolicy.ALLOWED)]
    with hb.store.tx() as session:
        for i, req in enumerate(jobs):
            res = hb.place(req, now=NOW)
            assert res.baselines  # the app records what the baselines need
            decisions.record_decision(session, job_id=f"j{i}", namespace="team-a", request=req, result=res,
                                      policy="cost", catalog_version=hb.catalog_version, now=NOW,
                                      kind="placement")
    report = report_from_store(settings.effective_database_url, data_dir=tmp_path, now=NOW)
    assert [w.status for w in report.whatif] == ["ok"] * len(report.whatif) and report.whatif
    spot = next(w for w in report.whatif if w.key == "spot-everywhere")
    assert spot.jobs_replaced == 3 and spot.whatif_usd < spot.recorded_usd  # the two on-demand jobs go spot
    assert report.deadlines.premium_usd is not None and "re-placed 1 of 1" in report.deadlines.premium_note
    assert all(b.exact_jobs == 3 for b in report.baselines)
