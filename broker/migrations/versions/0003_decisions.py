"""Placement decision records (issue 7): one row per placement and per preview.

Revision ID: 0003_decisions
Revises: 0002_edge
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_decisions"
down_revision = "0002_edge"
branch_labels = None
depends_on = None

TABLE = "decision_records"


def upgrade() -> None:
    """Create ``decision_records`` exactly as ``broker.decisions.DecisionRecord`` declares it."""
    op.create_table(
        TABLE,
        sa.Column("id", sa.Integer(), primary_key=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=True),
        sa.Column("namespace", sa.String(length=128), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("job_name", sa.String(length=256), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("chosen", sa.JSON(), nullable=True),
        sa.Column("alternatives", sa.JSON(), nullable=False),
        sa.Column("rejected", sa.JSON(), nullable=False),
        sa.Column("constraints", sa.JSON(), nullable=False),
        sa.Column("considered", sa.Integer(), nullable=False),
        sa.Column("feasible", sa.Integer(), nullable=False),
        sa.Column("policy", sa.String(length=64), nullable=False),
        sa.Column("catalog_version", sa.String(length=128), nullable=False),
        sa.Column("explanation", sa.String(), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=True),
        sa.Column("region", sa.String(length=64), nullable=True),
        sa.Column("capacity", sa.String(length=16), nullable=True),
        sa.Column("total_usd", sa.Float(), nullable=True),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("predicted_finish_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("runtime_hours", sa.Float(), nullable=True),
        sa.Column("actual_cost_usd", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline_met", sa.Boolean(), nullable=True),
    )
    op.create_index("ix_decision_records_job_id", TABLE, ["job_id"])
    op.create_index("ix_decision_records_namespace", TABLE, ["namespace"])
    op.create_index("ix_decision_records_created_at", TABLE, ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_decision_records_created_at", table_name=TABLE)
    op.drop_index("ix_decision_records_namespace", table_name=TABLE)
    op.drop_index("ix_decision_records_job_id", table_name=TABLE)
    op.drop_table(TABLE)
