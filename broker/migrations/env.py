"""Alembic environment of the broker: uses the connection handed over by :func:`broker.migrations.upgrade`
(or the URL of the config for the ``alembic`` command line)."""

from __future__ import annotations

import importlib

import sqlalchemy as sa
from alembic import context
from sqlmodel import SQLModel

# Every module that declares tables, so that the metadata matches the migrations.
for _module in ("broker.store", "broker.devices", "broker.decisions", "broker.policy_store", "broker.ops.store"):
    importlib.import_module(_module)

target_metadata = SQLModel.metadata
config = context.config


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = sa.create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
