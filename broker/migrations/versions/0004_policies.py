"""Policy documents and the spend ledger (issue 5): quotas, priority classes, budgets, reservations.

Revision ID: 0004_policies
Revises: 0003_decisions
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_policies"
down_revision = "0003_decisions"
branch_labels = None
depends_on = None


def _ts(name: str, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    """Create the tables exactly as ``broker.policy_store`` declares them."""
    op.create_table(
        "policy_quotas",
        sa.Column("namespace", sa.String(length=63), primary_key=True, nullable=False),
        sa.Column("name", sa.String(length=253), primary_key=True, nullable=False),
        sa.Column("hard", sa.JSON(), nullable=False),
        sa.Column("cohort", sa.String(length=253), nullable=True),
        sa.Column("borrowing_limit", sa.JSON(), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        _ts("updated_at"),
    )
    op.create_index("ix_policy_quotas_cohort", "policy_quotas", ["cohort"])
    op.create_table(
        "policy_priority_classes",
        sa.Column("name", sa.String(length=253), primary_key=True, nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("preemption_policy", sa.String(length=32), nullable=False),
        sa.Column("global_default", sa.Boolean(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        _ts("updated_at"),
    )
    op.create_table(
        "policy_budgets",
        sa.Column("namespace", sa.String(length=63), primary_key=True, nullable=False),
        sa.Column("name", sa.String(length=253), primary_key=True, nullable=False),
        sa.Column("daily_usd", sa.Float(), nullable=True),
        sa.Column("monthly_usd", sa.Float(), nullable=True),
        sa.Column("enforcement", sa.String(length=8), nullable=False),
        _ts("updated_at"),
    )
    op.create_table(
        "policy_reservations",
        sa.Column("name", sa.String(length=253), primary_key=True, nullable=False),
        sa.Column("pool", sa.String(length=253), nullable=False),
        sa.Column("cpu", sa.Float(), nullable=False),
        sa.Column("memory_gib", sa.Float(), nullable=False),
        sa.Column("gpus", sa.Float(), nullable=False),
        sa.Column("priority_class", sa.String(length=253), nullable=True),
        sa.Column("namespace", sa.String(length=63), nullable=True),
        _ts("updated_at"),
    )
    op.create_table(
        "policy_spend",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True, nullable=False),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("usd", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        _ts("at"),
    )
    op.create_index("ix_policy_spend_namespace", "policy_spend", ["namespace"])
    op.create_index("ix_policy_spend_at", "policy_spend", ["at"])


def downgrade() -> None:
    op.drop_index("ix_policy_spend_at", table_name="policy_spend")
    op.drop_index("ix_policy_spend_namespace", table_name="policy_spend")
    op.drop_table("policy_spend")
    op.drop_table("policy_reservations")
    op.drop_table("policy_budgets")
    op.drop_table("policy_priority_classes")
    op.drop_index("ix_policy_quotas_cohort", table_name="policy_quotas")
    op.drop_table("policy_quotas")
