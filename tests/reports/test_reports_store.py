"""Decision records in a real store (SQLite and PostgreSQL): write, outcome, query, migration."""

from __future__ import annotations

import dataclasses
import importlib.util
from datetime import timedelta
from pathlib import Path

import pytest
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from broker.decisions import DecisionRecord, query_decisions, record_decision, record_outcome, record_outcomes
from broker.reports.store import load_records
from tests.reports.builders import T0, make_option, make_request, make_result, synthetic
from tests.reports.conftest import fill

REPO = Path(__file__).resolve().parents[2]


def _record(session: Session, job_id: str = "j1", *, deadline_hours: float | None = None, **kw: object) -> int:
    chosen = make_option("azure", "westeurope", hourly=2.0, hours=3.0, egress=1.5, capacity="spot")
    runner = make_option("aws", "us-east-1", hourly=1.0, hours=3.0, egress=9.0)
    deadline = None if deadline_hours is None else T0 + timedelta(hours=deadline_hours)
    req = make_request("train", hours=3.0, data=(("aws:eu-west-1", 100.0),), deadline=deadline)
    return record_decision(
        session, job_id=job_id, namespace="team-a", request=req, result=make_result(chosen, runner),
        policy="cost", catalog_version="cat-v1", now=T0, **kw,  # type: ignore[arg-type]
    )


def test_a_decision_keeps_the_request_choice_alternatives_and_prices(store_engine: Engine) -> None:
    with Session(store_engine) as s:
        rid = _record(s, deadline_hours=10)
        s.commit()
    with Session(store_engine) as s:
        rec = s.get(DecisionRecord, rid)
        assert rec is not None
        assert rec.chosen is not None and rec.chosen["provider"] == "azure" and rec.chosen["site"] == "cloud"
        assert rec.chosen["total_usd"] == pytest.approx(6.0 + 1.5)
        assert [a["provider"] for a in rec.alternatives] == ["azure", "aws"]
        assert rec.request["data"] == [{"uri": "s3://bucket/train/0", "location": "aws:eu-west-1", "size_gib": 100.0}]
        assert rec.constraints["spot"] == "never" and rec.rejected == {"InsufficientVCPUs": 40, "DeadlineMiss": 3}
        assert (rec.catalog_version, rec.provider, rec.region) == ("cat-v1", "azure", "westeurope")
        assert rec.capacity == "spot"
        assert rec.predicted_finish_at is not None
        assert rec.predicted_finish_at.replace(tzinfo=None) == (T0 + timedelta(hours=3)).replace(tzinfo=None)


def test_record_decision_leaves_the_commit_to_the_caller(store_engine: Engine) -> None:
    with Session(store_engine) as s:
        assert _record(s) > 0
        s.rollback()
    with Session(store_engine) as s:
        assert s.exec(select(func.count()).select_from(DecisionRecord)).one() == 0


def test_an_unknown_kind_is_refused(store_engine: Engine) -> None:
    with Session(store_engine) as s, pytest.raises(ValueError, match="kind"):
        _record(s, kind="guess")


@pytest.mark.parametrize(
    ("deadline_hours", "runtime", "met"),
    [(10, 2.5, True), (2, 2.5, False), (None, 2.5, None)],
    ids=["a run finishing before its deadline met it", "a late run missed it", "no deadline, no verdict"],
)
def test_record_outcome_prices_the_actual_runtime(
    store_engine: Engine, deadline_hours: float | None, runtime: float, met: bool | None
) -> None:
    with Session(store_engine) as s:
        _record(s, deadline_hours=deadline_hours)
        s.commit()
        rec = record_outcome(s, "j1", runtime, T0 + timedelta(hours=runtime))
        s.commit()
        assert rec is not None
        assert rec.actual_cost_usd == pytest.approx(2.0 * runtime + 1.5)  # hourly x runtime + egress paid
        assert rec.deadline_met is met
        assert record_outcome(s, "no-such-job", 1.0, T0) is None
        with pytest.raises(ValueError):
            record_outcome(s, "j1", -1.0, T0)


def test_record_outcomes_writes_what_record_outcome_writes_one_job_at_a_time(store_engine: Engine) -> None:
    """The scheduler's bulk writer: same values on the same records (the latest placement of each job),
    jobs without a record skipped, a negative runtime refused before anything is written."""
    runs = [("j1", 2.5, T0 + timedelta(hours=2.5)), ("j2", 4.0, T0 + timedelta(hours=4)),
            ("j3", 0.5, T0 + timedelta(hours=0.5)), ("none", 1.0, T0)]
    with Session(store_engine) as s:
        for job_id, deadline in (("j1", 10), ("j2", 2), ("j3", None)):
            _record(s, job_id, deadline_hours=deadline)
        older = _record(s, "j2", deadline_hours=2)  # j2 placed twice: the latest record (highest id) gets it
        s.commit()
        with pytest.raises(ValueError):
            record_outcomes(s, [("j1", 1.0), ("j2", -1.0)], T0)
        assert sum(record_outcomes(s, [(job_id, hours)], end) for job_id, hours, end in runs) == 3
        s.commit()
        bulk = {(r.job_id, r.id): (r.runtime_hours, r.actual_cost_usd, r.deadline_met, r.finished_at)
                for r in s.exec(select(DecisionRecord)).all()}
        assert bulk[("j2", older)][0] == 4.0 and sum(v[0] is not None for v in bulk.values()) == 3
    with Session(store_engine) as s:
        s.execute(DecisionRecord.__table__.update().values(  # type: ignore[attr-defined]
            runtime_hours=None, actual_cost_usd=None, deadline_met=None, finished_at=None))
        for job_id, hours, at in runs:
            record_outcome(s, job_id, hours, at)
        s.commit()
        one_by_one = {(r.job_id, r.id): (r.runtime_hours, r.actual_cost_usd, r.deadline_met, r.finished_at)
                      for r in s.exec(select(DecisionRecord)).all()}
    assert bulk == one_by_one


def test_query_filters_by_namespace_and_window_and_core_load_agrees(store_engine: Engine) -> None:
    fill(store_engine, synthetic(60))
    since, until = T0 + timedelta(hours=1), T0 + timedelta(hours=5)
    with Session(store_engine) as s:
        every = query_decisions(s)
        assert len(every) == 60
        some = query_decisions(s, namespace="ml", since=since, until=until)
        assert some and all(r.namespace == "ml" for r in some)
        expected = [
            r.id for r in every
            if r.namespace == "ml" and since <= r.created_at.replace(tzinfo=T0.tzinfo) < until
        ]
        assert [r.id for r in some] == expected
        fast = load_records(s, "ml", since, until)
        assert [r.id for r in fast] == expected
        assert [r.chosen for r in fast] == [r.chosen for r in some]
        assert all(r.created_at.tzinfo is not None for r in fast)


def _migration(name: str = "0003_decisions"):  # type: ignore[no-untyped-def]
    path = REPO / "broker" / "migrations" / "versions" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"hb_migration_{name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_migration_0003_creates_the_table_the_model_declares(tmp_path: Path, reports_pg_url: str) -> None:
    mig = _migration()
    assert (mig.revision, mig.down_revision) == ("0003_decisions", "0002_edge")
    mig12 = _migration("0006_issue12_baselines")  # adds the baselines column
    assert mig12.revision == "0006_issue12_baselines"
    model = DecisionRecord.__table__  # type: ignore[attr-defined]
    for url in (f"sqlite:///{tmp_path}/m.db", reports_pg_url):
        engine = create_engine(url)
        with engine.begin() as conn, Operations.context(MigrationContext.configure(conn)):
            mig.upgrade()
            mig12.upgrade()
        insp = inspect(engine)
        cols = {c["name"]: c for c in insp.get_columns("decision_records")}
        assert set(cols) == {c.name for c in model.columns}
        for c in model.columns:
            assert cols[c.name]["nullable"] == c.nullable, c.name
        assert {i["name"] for i in insp.get_indexes("decision_records")} == {i.name for i in model.indexes}
        # the ORM writes into the migrated table
        with Session(engine) as s:
            _record(s)
            s.commit()
            assert len(query_decisions(s)) == 1
        with engine.begin() as conn, Operations.context(MigrationContext.configure(conn)):
            mig.downgrade()
        assert not inspect(engine).has_table("decision_records")
        engine.dispose()


def test_the_bulk_writer_stores_what_the_single_writer_stores(store_engine: Engine) -> None:
    from broker.decisions import record_decisions

    chosen = make_option("azure", "westeurope", hourly=2.0, hours=3.0, egress=1.5, capacity="spot")
    runner = make_option("aws", "us-east-1", hourly=1.0, hours=3.0, egress=9.0)
    req = make_request("train", hours=3.0, data=(("aws:eu-west-1", 100.0),), deadline=T0 + timedelta(hours=9))
    args = dict(namespace="team-a", request=req, result=make_result(chosen, runner), policy="cost",
                catalog_version="cat-v1", now=T0, kind="placement")
    with Session(store_engine) as s:
        record_decision(s, job_id="single", **args)  # type: ignore[arg-type]
        assert record_decisions(s, [dict(args, job_id="bulk-1"), dict(args, job_id="bulk-2")]) == 2
        s.commit()
    with Session(store_engine) as s:
        rows = {r.job_id: r for r in s.exec(select(DecisionRecord)).all()}
    assert set(rows) == {"single", "bulk-1", "bulk-2"}
    columns = [c for c in DecisionRecord.model_fields if c not in ("id", "job_id")]
    for name in ("bulk-1", "bulk-2"):
        assert {c: getattr(rows[name], c) for c in columns} == {c: getattr(rows["single"], c) for c in columns}


def test_the_bulk_writer_stores_the_same_text_across_calls_with_a_shared_memo(store_engine: Engine) -> None:
    """The bulk writer (SQLite: JSON encoded once per shared value, kept in the memo across calls) stores the
    very text the single writer stores, with and without a placement (a JSON null), with baselines and not."""
    import sqlalchemy as sa

    from broker.decisions import JsonMemo, record_decisions

    chosen = make_option("azure", "westeurope", hourly=2.0, hours=3.0, egress=1.5, capacity="spot")
    runner = make_option("aws", "us-east-1", hourly=1.0, hours=3.0, egress=9.0)
    req = make_request("train", hours=3.0, deadline=T0 + timedelta(hours=9))
    placed = make_result(chosen, runner)
    results = {"placed": placed, "none": make_result(None, runner),
               "baselines": dataclasses.replace(placed, baselines={"on-demand": runner, "ignore-data": chosen,
                                                                   "regions": {"aws:us-east-1": 3.0}})}
    memo = JsonMemo()
    with Session(store_engine) as s:
        for name, result in results.items():
            args = dict(namespace="team-a", request=req, result=result, policy="cost", catalog_version="cat-v1",
                        now=T0, kind="placement")
            record_decision(s, job_id=f"single-{name}", **args)  # type: ignore[arg-type]
            for k in range(2):  # the second call finds the shared values' text in the memo
                assert record_decisions(s, [dict(args, job_id=f"bulk-{k}-{name}")], memo=memo) == 1
        s.commit()
        cols = ", ".join(c for c in DecisionRecord.model_fields if c not in ("id", "job_id"))
        stored = {r[0]: r[1:] for r in s.execute(sa.text(f"SELECT job_id, {cols} FROM decision_records"))}
    for name in results:
        assert stored[f"bulk-0-{name}"] == stored[f"single-{name}"] == stored[f"bulk-1-{name}"]


def test_the_bulk_outcome_writer_stores_what_the_single_writer_stores(store_engine: Engine) -> None:
    """Two stores' worth of the same records (a job placed twice: the latest record gets the outcome; one with
    a deadline met, one missed, one without; one never placed); outcomes one by one vs in one call."""
    from broker.decisions import record_outcomes

    runs = {"met": 2.5, "late": 2.5, "free": 1.0, "twice": 4.0, "none": 1.0}
    deadlines = {"met": 10.0, "late": 2.0, "twice": 3.0}
    columns = [c for c in DecisionRecord.model_fields if c != "id"]
    got = []
    for bulk in (False, True):
        with Session(store_engine) as s:
            for job in ("met", "late", "free", "twice"):
                _record(s, f"{bulk}-{job}", deadline_hours=deadlines.get(job))
            _record(s, f"{bulk}-twice", deadline_hours=5.0)  # re-placed later: same created_at, higher id
            s.commit()
            end = T0 + timedelta(hours=2.5)
            if bulk:
                assert record_outcomes(s, [(f"{bulk}-{j}", h) for j, h in runs.items()], end) == 4
                with pytest.raises(ValueError):
                    record_outcomes(s, [("True-met", -1.0)], end)
            else:
                for j, h in runs.items():
                    record_outcome(s, f"{bulk}-{j}", h, end)
            s.commit()
        with Session(store_engine) as s:
            rows = s.exec(select(DecisionRecord).where(DecisionRecord.job_id.startswith(f"{bulk}-"))  # type: ignore[union-attr]
                          .order_by(DecisionRecord.id)).all()
            got.append([{c: (getattr(r, c).split("-", 1)[1] if c == "job_id" else getattr(r, c)) for c in columns}
                        for r in rows])
    assert len(got[0]) == 5 and sum(r["runtime_hours"] is not None for r in got[0]) == 4
    assert got[0] == got[1]
