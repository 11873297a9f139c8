"""The report's fast paths give what the plain paths give: the Core loader reads what the ORM
reads, and the lazily built decisions render exactly as eagerly built ones."""

from __future__ import annotations

import dataclasses
import gc
from datetime import timedelta

from sqlalchemy.engine import Engine
from sqlmodel import Session

from broker.decisions import query_decisions, record_outcome
from broker.model import PlacementResult
from broker.reports import build_report, render_csv, render_json
from broker.reports.build import to_rec
from broker.reports.store import load_records
from tests.reports.builders import T0, Decision, make_option, make_request, synthetic
from tests.reports.conftest import fill


def _odd_decisions() -> list[Decision]:
    """Records the loader's shortcuts must not mistake: a choice that is not the first alternative,
    one absent from the alternatives, and one with no alternatives at all."""
    a = make_option("aws", "us-east-1", hourly=1.0)
    b = make_option("gcp", "us-central1", hourly=1.2, egress=0.4)
    c = make_option("azure", "eastus", hourly=0.9, capacity="spot")
    req = make_request("odd", data=(("aws:eu-west-1", 20.0),), deadline=T0 + timedelta(hours=6))
    return [
        Decision("odd-1", "a", req, PlacementResult("odd", b, (a, b), 9, 2, {"DeadlineMiss": 2}, "v1"), T0),
        Decision("odd-2", "a", req, PlacementResult("odd", c, (a, b), 9, 3, {}, "v1"), T0),
        Decision("odd-3", "a", req, PlacementResult("odd", a, (), 9, 1, {}, "v1"), T0),
    ]


def test_the_core_loader_reads_every_field_the_orm_reads(store_engine: Engine) -> None:
    decisions = list(synthetic(80, seed=13)) + _odd_decisions()
    fill(store_engine, decisions)
    with Session(store_engine) as s:
        for i, d in enumerate(decisions[:40:4]):
            record_outcome(s, d.job_id, 1.0 + i, d.at + timedelta(hours=1.0 + i))
        s.commit()
        slow = [to_rec(r) for r in query_decisions(s)]
        fast = load_records(s)
    assert len(fast) == len(slow) == len(decisions)
    fields = [f.name for f in dataclasses.fields(fast[0]) if f.name != "explanation"]  # the report never reads it
    for got, want in zip(fast, slow, strict=True):
        assert {k: getattr(got, k) for k in fields} == {k: getattr(want, k) for k in fields}, want.job_id
    odd = {r.job_id: r for r in fast if r.job_id and r.job_id.startswith("odd")}
    assert odd["odd-1"].chosen is not None and odd["odd-1"].chosen["provider"] == "gcp"
    assert odd["odd-2"].chosen is not None and odd["odd-2"].chosen["capacity"] == "spot"
    assert odd["odd-3"].alternatives == [] and odd["odd-3"].chosen is not None


def test_lazy_decisions_render_exactly_as_eagerly_built_ones(store_engine: Engine) -> None:
    fill(store_engine, list(synthetic(150, seed=21)) + _odd_decisions())
    with Session(store_engine) as s:
        record_outcome(s, "j3", 2.5, T0 + timedelta(hours=3))
        s.commit()
        lazy = build_report(query_decisions(s))
    assert gc.isenabled()  # the collector pause is undone
    eager = dataclasses.replace(lazy, decisions=tuple(lazy.decisions))
    assert render_json(lazy) == render_json(eager)
    assert render_json(lazy, indent=2) == render_json(eager, indent=2)
    assert render_csv(lazy) == render_csv(eager)
    assert lazy.to_dict() == eager.to_dict()
    # the lazy list behaves as the tuple it stands for
    assert len(lazy.decisions) == len(eager.decisions) > 0
    assert lazy.decisions == eager.decisions
    assert lazy.decisions[-3:] == eager.decisions[-3:]
    assert lazy.decisions[0] == eager.decisions[0] and lazy.decisions[-1] == eager.decisions[-1]
    odd1 = next(d for d in lazy.decisions if d.job_id == "odd-1")
    assert odd1.chosen is not None and odd1.runner_up is not None
    assert (odd1.chosen.provider, odd1.runner_up.provider) == ("gcp", "aws")
    assert "2 offers could not meet the deadline" in odd1.why


def test_a_report_of_no_records_is_empty_in_every_format() -> None:
    report = build_report([])
    assert len(report.decisions) == 0 and list(report.decisions) == [] and report.decisions[:5] == ()
    assert report.to_dict()["decisions"] == []
    assert render_csv(report).count("\n") == 1  # the header only
