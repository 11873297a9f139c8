"""Scheduler leadership: the fencing token of each leader's term (issue 17, ``broker.leader``).

Revision ID: 0006_issue17_leader
Revises: 0006_issue14_ops (chained at merge)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_issue17_leader"
down_revision = "0006_issue14_ops"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``leader_epochs`` exactly as ``broker.leader.LeaderEpochRow`` declares it."""
    op.create_table(
        "leader_epochs",
        sa.Column("name", sa.String(length=63), primary_key=True, nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leader_epochs")
