"""Alembic migrations of the broker's store, applied on start by :func:`upgrade`.

The script location lives inside the package, so migrations run from an installed wheel too. Other areas
chain their revisions after ``0001_core`` (``0002_edge``, ``0003_decisions``, ``0004_policies``).
On PostgreSQL the upgrade holds an advisory lock so that brokers starting together migrate once.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Engine

__all__ = ["upgrade", "alembic_config", "SCRIPT_LOCATION", "MIGRATION_LOCK_ID"]

SCRIPT_LOCATION = Path(__file__).resolve().parent
MIGRATION_LOCK_ID = 0x6862_6D69  # "hbmi": advisory lock key of migrations on PostgreSQL


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` whose scripts are this package's."""
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema of ``engine``'s database to ``revision`` (idempotent)."""
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_ID})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
