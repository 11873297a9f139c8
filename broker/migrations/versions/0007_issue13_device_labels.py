"""Edge device labels for placement (issue 13): ``edge_devices.labels`` and the labels an enrollment token
gives the device it enrolls (``edge_enroll_tokens.labels``), JSON objects of Kubernetes-style labels.

Revision ID: 0007_issue13_device_labels
Revises: 0006_issue12_baselines (chained at merge)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_issue13_device_labels"
down_revision = "0006_issue12_baselines"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("edge_devices", "edge_enroll_tokens"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("labels", sa.Text(), nullable=False, server_default="{}"))


def downgrade() -> None:
    for table in ("edge_devices", "edge_enroll_tokens"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("labels")
