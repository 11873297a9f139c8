"""Tenancy and replicas (issue 17): per-namespace PriorityClass allow-lists, cancel requests carried out by the
replica that can stop the run, and stored log tails every replica can serve.

Revision ID: 0007_issue17_tenancy
Revises: 0007_issue13_device_labels
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_issue17_tenancy"
down_revision = "0007_issue13_device_labels"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``policy_allowed_priority_classes`` and ``job_log_tails`` and add ``jobs.cancel_requested_at``,
    exactly as ``broker.policy_store.AllowedPriorityClassesRecord``, ``broker.store.JobLogTailRow`` and
    ``broker.store.JobRow`` declare them."""
    op.create_table(
        "policy_allowed_priority_classes",
        sa.Column("namespace", sa.String(length=63), primary_key=True, nullable=False),
        sa.Column("names", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "job_log_tails",
        sa.Column("job_id", sa.String(length=40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True,
                  nullable=False),
        sa.Column("stream", sa.String(length=8), primary_key=True, nullable=False),
        sa.Column("instance_id", sa.String(length=200), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("ended", sa.Boolean(), nullable=False),
        sa.Column("stored_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cancel_requested_at")
    op.drop_table("job_log_tails")
    op.drop_table("policy_allowed_priority_classes")
