"""Issue 17, the request path under abuse and outages: JSON 503 while the database is down, bounded label
filters and statement time, body-size limits on every route (real uvicorn, SQLite and PostgreSQL)."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from broker.store import Store
from tests.broker.pg_cluster import PgCluster
from tests.broker.service_support import ADMIN_H, job_doc, make_app, serve_in_thread

NS = "default"


@pytest.mark.network
def test_a_database_outage_answers_json_503_with_retry_after_logs_once_and_recovers(
    tmp_path: Path, pg_cluster: PgCluster, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(tmp_path, pg_cluster.new_database())
    jobs = f"/v1/namespaces/{NS}/jobs"
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=ADMIN_H, timeout=30) as client:
        first = client.post(jobs, json=job_doc("before"))
        assert first.status_code in (200, 201), first.text
        pg_cluster.stop()
        try:
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                answers = [client.get(jobs) for _ in range(10)] + [client.post(jobs, json=job_doc(f"x{i}"))
                                                                 for i in range(5)]
        finally:
            pg_cluster.start()
        for r in answers:
            assert r.status_code == 503, (r.status_code, r.text)
            assert r.headers["retry-after"] == "5" and r.headers["content-type"] == "application/json"
            assert "store is unavailable" in r.json()["detail"] and r.json()["retry_after_seconds"] == 5
        outage_lines = [rec for rec in caplog.records if "store is unavailable" in rec.getMessage()]
        assert len(outage_lines) == 1, [rec.getMessage() for rec in caplog.records]
        assert not any(rec.exc_info for rec in caplog.records), "no traceback per failed request"
        pg_cluster.wait_up()
        after = client.get(jobs)
        assert after.status_code == 200
        assert [j["name"] for j in after.json()["jobs"]] == ["before"], "nothing half-written in the outage"


def test_a_thousand_label_filters_answer_422_and_statements_are_time_bounded(tmp_path: Path, store_url: str) -> None:
    app = make_app(tmp_path, store_url)
    params = [("label", f"k{i}=v") for i in range(1000)]
    with serve_in_thread(app) as url:
        r = httpx.get(f"{url}/v1/namespaces/{NS}/jobs", params=params, headers=ADMIN_H, timeout=30)
        ok = httpx.get(f"{url}/v1/namespaces/{NS}/jobs", params=params[:16], headers=ADMIN_H, timeout=30)
    assert r.status_code == 422 and "at most 16" in r.json()["detail"]
    assert ok.status_code == 200
    store: Store = app.state.hb.store
    if store.is_postgres:  # every session of the store carries the server-side limit
        with store.read() as session:
            assert session.execute(sa.text("SHOW statement_timeout")).scalar() == "30s"
    short = Store(store_url, statement_timeout_ms=300)  # the same engine factory with a short limit
    try:
        with pytest.raises(sa.exc.OperationalError), short.engine.connect() as conn:
            conn.execute(sa.text("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "
                                 "SELECT count(*) FROM r")).scalar()
        with short.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1, "the connection is usable afterwards"
    finally:
        short.dispose()


def test_every_route_refuses_an_oversized_body_with_413_json_before_reading_it(tmp_path: Path) -> None:
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'b.db'}", max_body_bytes=256 * 1024)

    def chunks(n: int, size: int = 64 * 1024):
        for _ in range(n):
            yield b"x" * size

    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        enroll_big = client.post("/v1/edge/enroll", content=b"{" + b" " * (200 * 1024) + b"}",
                                 headers={"content-type": "application/json"})
        enroll_streamed = client.post("/v1/edge/enroll", content=chunks(4),
                                      headers={"content-type": "application/json"})
        apply_big = client.post("/v1/policies:apply", content=b"x" * (300 * 1024), headers=ADMIN_H)
        apply_streamed = client.post("/v1/policies:apply", content=chunks(8), headers=ADMIN_H)
        small = client.post("/v1/edge/enroll", json={"token": "nope", "csr_pem": "nope"})
    for r in (enroll_big, enroll_streamed, apply_big, apply_streamed):
        assert r.status_code == 413 and "exceeds" in r.json()["detail"], (r.status_code, r.text)
    assert "65536" in enroll_big.json()["detail"], "the unauthenticated enroll route has the smaller limit"
    assert small.status_code not in (413, 500)
