"""Fixtures shared by every test area.

``store_url`` runs a test once on SQLite (a file in the test's temp dir, WAL) and once on PostgreSQL
(127.0.0.1:5432, user ``postgres``, trust auth). PostgreSQL gets one throwaway database per test session,
``hb_test_<random>``, dropped at the end; each test gets its own schema in it (``search_path``), dropped
after the test, so tests never see each other's rows. When PostgreSQL is unreachable the PostgreSQL half
is skipped, unless the environment variable ``CI`` is set: then it fails.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

PG_HOST = os.environ.get("HB_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("HB_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("HB_TEST_PG_USER", "postgres")


def _pg_conninfo(dbname: str) -> str:
    return f"host={PG_HOST} port={PG_PORT} user={PG_USER} dbname={dbname} connect_timeout=3"


def pg_url(dbname: str, schema: str | None = None) -> str:
    """The SQLAlchemy URL of ``dbname`` on the test server, optionally pinned to ``schema``."""
    url = f"postgresql+psycopg://{PG_USER}@{PG_HOST}:{PG_PORT}/{dbname}"
    if schema:
        url += f"?options=-csearch_path%3D{schema}"
    return url


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str | None]:
    """Name of this session's throwaway PostgreSQL database, or None when the server is unreachable."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        yield None
        return
    try:
        admin = psycopg.connect(_pg_conninfo("postgres"), autocommit=True)
    except psycopg.OperationalError:
        yield None
        return
    name = f"hb_test_{secrets.token_hex(4)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield name
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _require_pg(pg_database: str | None) -> str:
    if pg_database is None:
        message = f"PostgreSQL is not reachable at {PG_HOST}:{PG_PORT} (start it: .ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI is set, so this is a failure")
        pytest.skip(message)
    return pg_database


@contextmanager
def pg_schema(pg_database: str | None) -> Iterator[str]:
    """A PostgreSQL URL whose ``search_path`` is a fresh schema of the session database (dropped after)."""
    import psycopg

    dbname = _require_pg(pg_database)
    schema = f"t_{secrets.token_hex(5)}"
    with psycopg.connect(_pg_conninfo(dbname), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield pg_url(dbname, schema)
    finally:
        with psycopg.connect(_pg_conninfo(dbname), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextmanager
def fresh_store_url(kind: str, request: pytest.FixtureRequest,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh, empty store URL of ``kind`` (``sqlite`` or ``postgresql``)."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('store') / 'broker.db'}"
        return
    with pg_schema(request.getfixturevalue("pg_database")) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh, empty store URL: SQLite (WAL file) or PostgreSQL (own schema in the session database)."""
    with fresh_store_url(request.param, request, tmp_path_factory) as url:
        yield url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Like ``store_url`` but shared by the tests of one module (for tests that only add rows)."""
    with fresh_store_url(request.param, request, tmp_path_factory) as url:
        yield url
