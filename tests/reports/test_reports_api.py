"""GET /v1/reports/placements served by uvicorn on 127.0.0.1 (a free port) over a real SQLite store,
with the service's auth and session dependencies overridden by real objects."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import create_engine
from sqlmodel import Session, SQLModel

from broker.api_deps import current_principal, get_clock, get_session, get_settings
from broker.api_reports import router
from broker.clock import ManualClock
from broker.config import Settings
from broker.decisions import DecisionRecord
from broker.tenants import Principal
from tests.reports.builders import T0, synthetic
from tests.reports.conftest import fill


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[str, dict[str, Principal]]]:
    engine = create_engine(f"sqlite:///{tmp_path}/broker.db", connect_args={"check_same_thread": False})
    SQLModel.metadata.create_all(engine, tables=[DecisionRecord.__table__])  # type: ignore[attr-defined]
    fill(engine, synthetic(120, seed=9))
    who = {"p": Principal(token_id="admin", namespace=None)}
    app = FastAPI()
    app.include_router(router)

    def session() -> Iterator[Session]:
        with Session(engine) as s:
            yield s

    app.dependency_overrides[get_session] = session
    app.dependency_overrides[current_principal] = lambda: who["p"]
    app.dependency_overrides[get_settings] = lambda: Settings(data_dir=tmp_path)
    app.dependency_overrides[get_clock] = lambda: ManualClock(T0.replace(day=5))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}", who
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.dispose()


def _client(base_url: Any) -> httpx.Client:
    return httpx.Client(base_url=base_url, timeout=30)


def test_admin_gets_every_namespace_as_json(app: tuple[str, dict[str, Principal]]) -> None:
    client = _client(app[0])
    r = client.get("/v1/reports/placements", params={"since": "30d"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert {row["key"] for row in doc["by_namespace"]} == {"team-a", "team-b", "ml"}


def test_a_namespace_token_sees_only_its_namespace(app: tuple[str, dict[str, Principal]]) -> None:
    base, who = app
    who["p"] = Principal(token_id="t1", namespace="ml")
    client = _client(base)
    doc = client.get("/v1/reports/placements", params={"since": "30d"}).json()
    assert {d["namespace"] for d in doc["decisions"]} == {"ml"}
    r = client.get("/v1/reports/placements", params={"namespace": "team-a"})
    assert r.status_code == 404 and "To fix" in r.json()["detail"]


def test_csv_over_http_opens_in_pandas_and_agrees_with_json(app: tuple[str, dict[str, Principal]]) -> None:
    client = _client(app[0])
    params = {"since": "2026-03-01", "until": "2026-03-03T00:00:00Z", "namespace": "team-b"}
    r = client.get("/v1/reports/placements", params={**params, "format": "csv"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    df = pd.read_csv(io.StringIO(r.text))
    doc = json.loads(client.get("/v1/reports/placements", params=params).text)
    assert len(df) == len(doc["decisions"]) > 0
    assert set(df["namespace"]) == {"team-b"}
    assert df["total_usd"].sum() == pytest.approx(doc["summary"]["estimated_spend_usd"])


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"since": "yesterday-ish"}, "since"),
        ({"until": "not a date"}, "until"),
        ({"since": "1d", "until": "2d"}, "after since"),
        ({"format": "pdf"}, "format"),
    ],
    ids=["an unreadable since", "an unreadable until", "a window that ends before it starts", "an unknown format"],
)
def test_bad_queries_get_422_with_a_message(
    app: tuple[str, dict[str, Principal]], params: dict[str, str], needle: str
) -> None:
    r = _client(app[0]).get("/v1/reports/placements", params=params)
    assert r.status_code == 422
    assert needle in json.dumps(r.json())
