"""Queue disciplines per namespace and decayed fair-share usage (issue 5, scheduler wiring).

Revision ID: 0005_queues
Revises: 0004_policies
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_queues"
down_revision = "0004_policies"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the tables exactly as ``broker.queues`` declares them."""
    op.create_table(
        "queue_settings",
        sa.Column("name", sa.String(length=63), primary_key=True, nullable=False),
        sa.Column("discipline", sa.String(length=16), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("half_life_seconds", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "fair_share_usage",
        sa.Column("namespace", sa.String(length=63), primary_key=True, nullable=False),
        sa.Column("cpu_hours", sa.Float(), nullable=False),
        sa.Column("memory_gib_hours", sa.Float(), nullable=False),
        sa.Column("gpu_hours", sa.Float(), nullable=False),
        sa.Column("usd", sa.Float(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("fair_share_usage")
    op.drop_table("queue_settings")
