"""Fixtures of the report tests: a SQLite store and a throwaway PostgreSQL database, both with the
tables created from the SQLModel metadata, and a helper that fills one with decisions."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel

from broker.decisions import DecisionRecord, record_decision
from tests.reports.builders import Decision

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@pytest.fixture(scope="session")
def reports_pg_url() -> Iterator[str]:
    """A throwaway PostgreSQL database for this session, dropped at the end."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"hb_reports_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # noqa: BLE001
        admin.dispose()
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL at 127.0.0.1:5432 is not reachable ({type(exc).__name__})")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_engine(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Engine]:
    """An engine on SQLite (a file) or PostgreSQL with an empty ``decision_records`` table."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/broker.db"
    else:
        url = request.getfixturevalue("reports_pg_url")
    engine = create_engine(url)
    table = DecisionRecord.__table__  # type: ignore[attr-defined]
    SQLModel.metadata.drop_all(engine, tables=[table])
    SQLModel.metadata.create_all(engine, tables=[table])
    try:
        yield engine
    finally:
        SQLModel.metadata.drop_all(engine, tables=[table])
        engine.dispose()


def fill(engine: Engine, decisions: Iterable[Decision], policy: str = "cost") -> int:
    """Record every decision (one commit) and return how many were written."""
    n = 0
    with Session(engine) as session:
        for d in decisions:
            record_decision(
                session, job_id=d.job_id, namespace=d.namespace, request=d.request, result=d.result,
                policy=policy, catalog_version=d.result.catalog_version, now=d.at, kind=d.kind,
            )
            n += 1
        session.commit()
    return n
