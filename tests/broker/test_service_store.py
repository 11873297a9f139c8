"""The store, migrations, lifecycle and tenants, on SQLite and PostgreSQL (``store_url``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from broker.errors import ConflictError, NotFoundError, SpecError
from broker.lifecycle import Transition, apply_transitions, submit_jobs, transition
from broker.migrations import upgrade
from broker.model import ALLOWED_TRANSITIONS, JobState
from broker.spec import parse_job_spec
from broker.store import JobEventRow, JobRow, Store, new_job_id
from broker.tenants import (
    authenticate,
    create_namespace,
    create_token,
    ensure_admin_token,
    hash_token,
    revoke_token,
)
from tests.broker.service_support import job_doc

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def store(module_store_url: str) -> Iterator[Store]:
    """One migrated store per backend for this module; every test works on its own new jobs."""
    s = Store(module_store_url)
    upgrade(s.engine)
    with s.tx() as session:
        create_namespace(session, "team-a", now=NOW)
    yield s
    s.dispose()


def _submit(store: Store, n: int = 1) -> list[str]:
    specs = [parse_job_spec(job_doc(f"j-{i}", labels={"k": str(i)}), now=NOW) for i in range(n)]
    with store.tx() as session:
        jobs = submit_jobs(session, "team-a", specs, now=NOW, spec_docs=[json.dumps(s.raw) for s in specs])
    return [j["id"] for j in jobs]


def _events(store: Store, job_id: str) -> list[tuple[str | None, str]]:
    t = JobEventRow.__table__  # type: ignore[attr-defined]
    with store.read() as session:
        return [(r.from_state, r.to_state) for r in
                session.execute(sa.select(t).where(t.c.job_id == job_id).order_by(t.c.id))]


def _state(store: Store, job_id: str) -> str:
    with store.read() as session:
        row = session.get(JobRow, job_id)
        assert row is not None
        return row.state


def test_migrations_create_every_core_table_and_are_idempotent(store: Store) -> None:
    upgrade(store.engine)  # a second start migrates nothing and does not fail
    tables = set(sa.inspect(store.engine).get_table_names())
    assert {"namespaces", "tokens", "jobs", "job_labels", "job_events", "attempts", "idempotency_keys"} <= tables
    with store.engine.connect() as conn:
        heads = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
    assert len(heads) == 1


def test_times_come_back_timezone_aware_utc(store: Store) -> None:
    (job_id,) = _submit(store)
    with store.read() as session:
        row = session.get(JobRow, job_id)
    assert row is not None and row.created_at == NOW and row.created_at.tzinfo is not None


def test_submission_writes_one_pending_event_per_job_in_order(store: Store) -> None:
    ids = _submit(store, 5)
    assert ids == sorted(ids), "job ids sort in submission order (FIFO tie-break)"
    for job_id in ids:
        assert _events(store, job_id) == [(None, "PENDING")]


ALL_PAIRS = [(src, dst) for src in JobState for dst in JobState]


@pytest.mark.parametrize(
    "src,dst", ALL_PAIRS, ids=[f"{s.value} to {d.value}" for s, d in ALL_PAIRS]
)
def test_only_allowed_transitions_change_state_and_each_writes_one_event(
    store: Store, src: JobState, dst: JobState
) -> None:
    (job_id,) = _submit(store)
    if src is not JobState.PENDING:  # force the source state directly (setup only)
        with store.tx() as session:
            session.connection().execute(
                sa.update(JobRow.__table__).where(JobRow.__table__.c.id == job_id).values(state=src.value)  # type: ignore[attr-defined]
            )
    before = _events(store, job_id)
    if dst in ALLOWED_TRANSITIONS[src]:
        with store.tx() as session:
            assert transition(session, job_id, dst, now=NOW, reason="test") is src
        assert _state(store, job_id) == dst.value
        assert _events(store, job_id) == before + [(src.value, dst.value)]
    else:
        with pytest.raises(ConflictError), store.tx() as session:
            transition(session, job_id, dst, now=NOW)
        assert _state(store, job_id) == src.value
        assert _events(store, job_id) == before


def test_a_failed_transaction_leaves_neither_state_nor_event(store: Store) -> None:
    (job_id,) = _submit(store)
    with pytest.raises(RuntimeError), store.tx() as session:
        transition(session, job_id, JobState.PLACED, now=NOW)
        raise RuntimeError("crash after the transition, before commit")
    assert _state(store, job_id) == "PENDING"
    assert _events(store, job_id) == [(None, "PENDING")]


def test_bulk_transitions_refuse_a_job_that_changed_state_meanwhile(store: Store) -> None:
    a, b = _submit(store, 2)
    with store.tx() as session:
        transition(session, b, JobState.CANCELLED, now=NOW)
    with pytest.raises(ConflictError), store.tx() as session:
        apply_transitions(session, [Transition(a, JobState.PENDING, JobState.PLACED),
                                    Transition(b, JobState.PENDING, JobState.PLACED)], now=NOW)
    assert (_state(store, a), _state(store, b)) == ("PENDING", "CANCELLED")


def test_a_chain_of_transitions_in_one_batch_updates_the_row_as_one_by_one(store: Store) -> None:
    """PENDING -> PLACED -> PROVISIONING of several jobs in one call (one update per job): the rows and events
    are those of applying each transition in its own call; a chain from a state the job is not in is refused."""
    a, b, c, d = _submit(store, 4)
    placed = {"placement_json": '{"provider": "aws"}', "provider": "aws", "region": "us-east-1"}

    def chain(job_id: str) -> list[Transition]:
        return [Transition(job_id, JobState.PENDING, JobState.PLACED, reason="placed", data={"x": 1}, fields=placed),
                Transition(job_id, JobState.PLACED, JobState.PROVISIONING, reason="provisioning",
                           fields={"request_id": f"{job_id}-r0", "region": "eu-west-1"})]

    with store.tx() as session:
        apply_transitions(session, chain(a) + chain(b), now=NOW)
    for t in chain(c):
        with store.tx() as session:
            apply_transitions(session, [t], now=NOW)
    columns = ("state", "placement_json", "provider", "region", "request_id")
    with store.read() as session:
        got = {j: tuple(getattr(session.get(JobRow, j), k) for k in columns) for j in (a, b, c)}
    for j in (a, b, c):  # the later transition's region wins, as when applied one by one
        assert got[j] == ("PROVISIONING", '{"provider": "aws"}', "aws", "eu-west-1", f"{j}-r0")
    for j in (a, b, c):
        assert _events(store, j) == [(None, "PENDING"), ("PENDING", "PLACED"), ("PLACED", "PROVISIONING")]
    with store.tx() as session:
        transition(session, d, JobState.CANCELLED, now=NOW)
    with pytest.raises(ConflictError), store.tx() as session:
        apply_transitions(session, chain(d), now=NOW)
    assert _state(store, d) == "CANCELLED"


def test_unknown_job_is_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError), store.tx() as session:
        transition(session, new_job_id(), JobState.PLACED, now=NOW)


def test_tokens_are_stored_only_as_hashes_and_revocation_takes_effect(store: Store) -> None:
    with store.tx() as session:
        row, secret = create_token(session, "team-a", now=NOW)
    with store.engine.connect() as conn:
        dump = " ".join(str(v) for r in conn.execute(sa.text("SELECT * FROM tokens")) for v in r)
    assert secret not in dump and hash_token(secret) in dump
    with store.read() as session:
        principal = authenticate(session, secret)
    assert principal is not None and principal.namespace == "team-a" and not principal.is_admin
    with store.tx() as session:
        revoke_token(session, row.id, now=NOW)
    with store.read() as session:
        assert authenticate(session, secret) is None
        assert authenticate(session, secret + "x") is None


def test_admin_token_is_created_once_from_config(store: Store) -> None:
    assert ensure_admin_token(store, now=NOW, configured="hb_cfg") == "hb_cfg"
    assert ensure_admin_token(store, now=NOW, configured="hb_other") is None
    with store.read() as session:
        admin = authenticate(session, "hb_cfg")
        assert admin is not None and admin.is_admin
        assert authenticate(session, "hb_other") is None


@pytest.mark.parametrize(
    "name,error",
    [("team-b", None), ("Team-B", SpecError), ("-x", SpecError), ("a" * 64, SpecError), ("team-a", ConflictError)],
    ids=["a DNS label is accepted", "uppercase is refused", "a leading dash is refused",
         "64 characters are too many", "an existing name conflicts"],
)
def test_namespace_names(store: Store, name: str, error: type[Exception] | None) -> None:
    if error is None:
        with store.tx() as session:
            assert create_namespace(session, name, now=NOW).name == name
    else:
        with pytest.raises(error), store.tx() as session:
            create_namespace(session, name, now=NOW)
