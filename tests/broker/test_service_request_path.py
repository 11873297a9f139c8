"""The fast request path of submissions: the token cache (revocation bounds), the group-committing single
writer, and the batch write of submissions; on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from broker.errors import SpecError
from broker.store import GroupCommitter, JobRow, Store
from broker.tenants import Principal, TokenCache, create_token, revoke_token
from tests.broker.service_support import ADMIN_H, job_doc, make_app, serve_in_thread

NOW = datetime(2026, 1, 1, tzinfo=UTC)
_jobs = JobRow.__table__  # type: ignore[attr-defined]


class FakeMonotonic:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# ------------------------------------------------------------------------------------------ token cache


def test_a_cached_token_expires_after_the_ttl() -> None:
    mono = FakeMonotonic()
    cache = TokenCache(2.0, monotonic=mono)
    p = Principal("tok_1", "team-a")
    cache.put("h1", p, epoch=cache.epoch)
    assert cache.get("h1") == p
    mono.t += 1.9
    assert cache.get("h1") == p
    mono.t += 0.2
    assert cache.get("h1") is None


def test_an_invalidation_drops_entries_and_a_lookup_that_started_before_it() -> None:
    cache = TokenCache(60.0)
    p = Principal("tok_1", None)
    cache.put("h1", p, epoch=cache.epoch)
    started = cache.epoch  # a lookup reads the store now, sees the token still valid ...
    cache.invalidate()  # ... while a revocation commits and invalidates
    cache.put("h2", p, epoch=started)  # ... so its late fill is dropped
    assert cache.get("h1") is None and cache.get("h2") is None


def test_the_cache_stays_bounded() -> None:
    cache = TokenCache(60.0, max_entries=3)
    for i in range(10):
        cache.put(f"h{i}", Principal(f"tok_{i}", None), epoch=cache.epoch)
    assert sum(cache.get(f"h{i}") is not None for i in range(10)) <= 3


@pytest.fixture
def two_apps(tmp_path: Path, store_url: str) -> Iterator[tuple[httpx.Client, httpx.Client, FakeMonotonic]]:
    """Two broker servers on ONE store (two processes sharing PostgreSQL, or SQLite), A with a hand clock."""
    mono = FakeMonotonic()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    app_a = make_app(tmp_path / "a", store_url)
    app_b = make_app(tmp_path / "b", store_url)
    app_a.state.hb.token_cache = TokenCache(2.0, monotonic=mono)
    with serve_in_thread(app_a) as url_a, serve_in_thread(app_b) as url_b, \
            httpx.Client(base_url=url_a, timeout=30) as a, httpx.Client(base_url=url_b, timeout=30) as b:
        yield a, b, mono


def _token(client: httpx.Client, ns: str) -> tuple[str, dict[str, str]]:
    client.post("/v1/namespaces", json={"name": ns}, headers=ADMIN_H)
    tok = client.post(f"/v1/namespaces/{ns}/tokens", headers=ADMIN_H).json()
    return tok["id"], {"Authorization": f"Bearer {tok['token']}"}


def test_a_revocation_through_this_process_takes_effect_at_once(
    two_apps: tuple[httpx.Client, httpx.Client, FakeMonotonic],
) -> None:
    a, _, _ = two_apps
    tok_id, h = _token(a, "team-now")
    assert a.post("/v1/namespaces/team-now/jobs", json=job_doc("x"), headers=h).status_code == 201  # cached
    assert a.delete(f"/v1/tokens/{tok_id}", headers=ADMIN_H).status_code == 200
    assert a.post("/v1/namespaces/team-now/jobs", json=job_doc("y"), headers=h).status_code == 401
    assert a.get("/v1/whoami", headers=h).status_code == 401


def test_a_revocation_by_another_process_takes_effect_within_the_ttl(
    two_apps: tuple[httpx.Client, httpx.Client, FakeMonotonic],
) -> None:
    a, b, mono = two_apps
    tok_id, h = _token(a, "team-ttl")
    assert a.get("/v1/whoami", headers=h).status_code == 200  # now cached in A
    assert b.delete(f"/v1/tokens/{tok_id}", headers=ADMIN_H).status_code == 200
    assert b.get("/v1/whoami", headers=h).status_code == 401  # B revoked it: at once in B
    assert a.get("/v1/whoami", headers=h).status_code == 200  # A trusts its cache for at most the TTL
    mono.t += 2.01
    assert a.get("/v1/whoami", headers=h).status_code == 401


# ------------------------------------------------------------------------------------------ group commit


def _counter_store(store_url: str) -> Store:
    store = Store(store_url)
    with store.engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE gc_items (k VARCHAR(16) PRIMARY KEY)"))
    return store


def _insert_keys(session: Any, keys: list[str]) -> list[str | BaseException]:
    out: list[str | BaseException] = []
    for k in keys:
        if k.startswith("bad"):
            out.append(SpecError("k", f"{k} is refused"))
            continue
        session.execute(sa.text("INSERT INTO gc_items (k) VALUES (:k)"), {"k": k})
        out.append(k.upper())
    return out


def _stored(store: Store) -> set[str]:
    with store.engine.connect() as conn:
        return {r[0] for r in conn.execute(sa.text("SELECT k FROM gc_items"))}


def _hold(writer: GroupCommitter[Any, Any]) -> tuple[threading.Event, Future[Any]]:
    """Occupy the writer with one blocking item so that what is submitted next forms one batch."""
    release = threading.Event()
    started = threading.Event()
    original = writer.write_batch

    def blocking(session: Any, items: list[Any]) -> list[Any]:
        if items == ["hold"]:
            started.set()
            release.wait(10)
            writer.write_batch = original
            return ["held"]
        return original(session, items)

    original_weight = writer.weight
    writer.write_batch = blocking
    writer.weight = lambda item: 1 if item == "hold" else original_weight(item)
    future = writer.submit("hold")
    assert started.wait(10)
    return release, future


def test_items_queued_together_are_committed_in_one_transaction(store_url: str) -> None:
    store = _counter_store(store_url)
    writer: GroupCommitter[str, str] = GroupCommitter(store, _insert_keys)
    release, held = _hold(writer)
    futures = [writer.submit(k) for k in ("a", "b", "c")]
    before = writer.batches
    release.set()
    assert held.result(10) == "held"
    assert [f.result(10) for f in futures] == ["A", "B", "C"]
    assert writer.batches == before + 2 and _stored(store) == {"a", "b", "c"}
    writer.close()
    store.dispose()


def test_an_item_refused_alone_does_not_affect_the_others_of_its_batch(store_url: str) -> None:
    store = _counter_store(store_url)
    writer: GroupCommitter[str, str] = GroupCommitter(store, _insert_keys)
    release, _ = _hold(writer)
    futures = [writer.submit(k) for k in ("a", "bad-1", "b")]
    release.set()
    assert futures[0].result(10) == "A" and futures[2].result(10) == "B"
    with pytest.raises(SpecError, match="bad-1 is refused"):
        futures[1].result(10)
    assert _stored(store) == {"a", "b"}
    writer.close()
    store.dispose()


def test_a_failing_batch_is_rolled_back_and_each_item_is_written_alone(store_url: str) -> None:
    store = _counter_store(store_url)
    writer: GroupCommitter[str, str] = GroupCommitter(store, _insert_keys)
    assert writer.submit("dup").result(10) == "DUP"
    release, _ = _hold(writer)
    futures = [writer.submit(k) for k in ("x", "dup", "y")]  # "dup" violates the primary key
    release.set()
    assert futures[0].result(10) == "X" and futures[2].result(10) == "Y"
    with pytest.raises(sa.exc.IntegrityError):
        futures[1].result(10)
    assert _stored(store) == {"dup", "x", "y"}
    writer.close()
    store.dispose()


def test_a_batch_holds_items_up_to_the_weight_limit(store_url: str) -> None:
    store = _counter_store(store_url)
    sizes: list[int] = []

    def record(session: Any, keys: list[str]) -> list[str | BaseException]:
        if keys != ["hold"]:
            sizes.append(len(keys))
        return _insert_keys(session, keys)

    writer: GroupCommitter[str, str] = GroupCommitter(store, record, max_batch=4, weight=len)
    release, _ = _hold(writer)
    futures = [writer.submit(k) for k in ("aa", "bb", "ccc", "d")]  # weights 2, 2, 3, 1
    release.set()
    assert [f.result(10) for f in futures] == ["AA", "BB", "CCC", "D"]
    assert sizes == [2, 2]
    writer.close()
    store.dispose()


def test_the_writer_thread_exits_when_idle_and_restarts_on_demand(store_url: str) -> None:
    store = _counter_store(store_url)
    writer: GroupCommitter[str, str] = GroupCommitter(store, _insert_keys, idle_seconds=0.05)
    assert writer.submit("a").result(10) == "A"
    thread = writer._thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive() and writer._thread is None
    assert writer.submit("b").result(10) == "B"
    writer.close()
    assert writer._thread is None and _stored(store) == {"a", "b"}
    store.dispose()


# ------------------------------------------------------------------------------------------ batch of submissions


@pytest.fixture
def app(tmp_path: Path, store_url: str) -> Iterator[Any]:
    application = make_app(tmp_path, store_url)
    yield application
    application.state.hb.writer.close()
    application.state.hb.store.dispose()


def _submission(app: Any, ns: str, body: bytes, key: str | None = None) -> Any:
    from broker.api import _prepare_submission

    return _prepare_submission(app.state.hb, ns, body, "application/json", key)


def test_a_batch_of_submissions_keeps_order_namespaces_keys_and_refusals(app: Any) -> None:
    import json

    from broker.api import write_submissions

    hb = app.state.hb
    with hb.store.tx() as session:
        from broker.tenants import create_namespace

        create_namespace(session, "team-x", now=NOW)
    subs = [
        _submission(app, "default", json.dumps(job_doc("d-1")).encode()),
        _submission(app, "team-x", json.dumps([job_doc("x-1"), job_doc("x-2")]).encode(), key="k1"),
        _submission(app, "default", json.dumps(job_doc("bad", priorityClassName="nope")).encode()),
        _submission(app, "default", json.dumps(job_doc("d-2")).encode(), key="k2"),
    ]
    with hb.store.tx() as session:
        outcomes: list[Any] = write_submissions(session, subs, clock=hb.clock)
    assert outcomes[0][0] == 201 and outcomes[0][1]["name"] == "d-1"
    assert [j["name"] for j in outcomes[1][1]["jobs"]] == ["x-1", "x-2"]
    assert all(j["namespace"] == "team-x" for j in outcomes[1][1]["jobs"])
    assert isinstance(outcomes[2], SpecError) and outcomes[2].field == "spec.priorityClassName"
    assert outcomes[3][1]["name"] == "d-2"
    ids = [outcomes[0][1]["id"], outcomes[3][1]["id"]]
    assert ids == sorted(ids)  # arrival order is queue order
    with hb.store.read() as session:
        names = set(session.scalars(sa.select(_jobs.c.name)))
    assert names >= {"d-1", "x-1", "x-2", "d-2"} and "bad" not in names
    # The keys' answers were stored with the jobs: a second batch replays them, or refuses another body.
    again = [subs[1], _submission(app, "default", json.dumps(job_doc("other")).encode(), key="k2")]
    with hb.store.tx() as session:
        replay, reused = write_submissions(session, again, clock=hb.clock)
    assert replay == (201, outcomes[1][1], True)
    assert isinstance(reused, SpecError) and reused.field == "Idempotency-Key"


def test_one_key_twice_in_a_batch_stores_the_jobs_once(app: Any) -> None:
    import json

    hb = app.state.hb
    body = json.dumps(job_doc("twice")).encode()
    writer = hb.writer
    release, _ = _hold(writer)
    futures = [writer.submit(_submission(app, "default", body, key="same")) for _ in range(2)]
    release.set()
    first, second = (f.result(10) for f in futures)
    assert first[2] is False and second == (201, first[1], True)
    with hb.store.read() as session:
        count = session.execute(sa.select(sa.func.count()).where(_jobs.c.name == "twice")).scalar()
    assert count == 1


def test_concurrent_http_submissions_all_land_exactly_once(app: Any) -> None:
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        def post(i: int) -> str:
            r = c.post("/v1/namespaces/default/jobs", json=job_doc(f"c-{i}"), headers=ADMIN_H)
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(post, range(64)))
    assert len(set(ids)) == 64
    with app.state.hb.store.read() as session:
        stored = set(session.scalars(sa.select(_jobs.c.id).where(_jobs.c.name.like("c-%"))))
    assert stored == set(ids)


def test_created_token_is_usable_at_once(app: Any) -> None:
    hb = app.state.hb
    with hb.store.tx() as session:
        _, secret = create_token(session, None, now=NOW, description="extra admin")
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/v1/whoami", headers={"Authorization": f"Bearer {secret}"}).json()["admin"] is True
    with hb.store.tx() as session:
        from broker.store import TokenRow

        tokens = TokenRow.__table__  # type: ignore[attr-defined]
        token_id = session.execute(sa.select(tokens.c.id).where(tokens.c.description == "extra admin")).scalar_one()
        revoke_token(session, token_id, now=NOW)
