"""Public names of the policies modules, and the 0004 migration matching the policy tables."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

MODULES = ["workload", "queueing", "quota", "budget", "priority", "qos", "admission", "deadline", "preemption",
           "reservations", "gang", "loadbalance", "batch"]


@pytest.mark.parametrize("name", MODULES, ids=[f"policies.{m} exports what it lists" for m in MODULES])
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(f"policies.{name}")
    assert module.__all__, f"policies.{name} lists no public names"
    assert [n for n in module.__all__ if not hasattr(module, n)] == []
    assert module.__doc__ and len(module.__doc__) > 80


def test_migration_0004_creates_the_policy_tables_as_declared(tmp_path: Path) -> None:
    import sqlalchemy as sa
    from sqlmodel import SQLModel

    import broker.policy_store  # noqa: F401  (registers the tables)
    from broker.migrations import upgrade
    from broker.store import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade(engine)
    inspector = sa.inspect(engine)
    for table in ("policy_quotas", "policy_priority_classes", "policy_budgets", "policy_reservations",
                  "policy_spend"):
        declared = SQLModel.metadata.tables[table]
        actual = {c["name"]: c for c in inspector.get_columns(table)}
        assert set(actual) == set(declared.columns.keys()), table
        for column in declared.columns:
            assert bool(actual[column.name]["nullable"]) == bool(column.nullable), f"{table}.{column.name}"
        assert {c for c in inspector.get_pk_constraint(table)["constrained_columns"]} == {
            c.name for c in declared.primary_key.columns}
    engine.dispose()
