"""Edge tables: devices, enrollment tokens, issued certificates, revocations, uplink messages, tasks.

Revision ID: 0002_edge
Revises: 0001_core
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_edge"
down_revision = "0001_core"
branch_labels = None
depends_on = None


def _ts(name: str, nullable: bool = False, index: bool = False) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable, index=index)


def upgrade() -> None:
    """Create the tables exactly as ``broker.devices`` declares them."""
    op.create_table(
        "edge_devices",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("cert_pem", sa.Text, nullable=False),
        sa.Column("cert_serial", sa.String(64), nullable=False),
        _ts("cert_not_after"),
        _ts("enrolled_at"),
        _ts("revoked_at", nullable=True),
        _ts("last_seen", nullable=True),
        sa.Column("online", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("last_seq", sa.BigInteger, nullable=False, server_default="-1"),
        sa.Column("vcpus", sa.Float, nullable=False, server_default="0"),
        sa.Column("memory_gib", sa.Float, nullable=False, server_default="0"),
        sa.Column("gpus", sa.Integer, nullable=False, server_default="0"),
        sa.Column("accelerator", sa.String(64), nullable=True),
        sa.Column("arch", sa.String(16), nullable=False, server_default="amd64"),
        sa.Column("disk_gib", sa.Float, nullable=False, server_default="0"),
        sa.Column("bandwidth_mbps", sa.Float, nullable=True),
        sa.Column("latency_ms", sa.Float, nullable=True),
        sa.Column("agent_version", sa.String(32), nullable=True),
        sa.Column("continent", sa.String(8), nullable=False, server_default=""),
        sa.Column("hourly_usd", sa.Float, nullable=False, server_default="0"),
    )
    op.create_index("ix_edge_devices_namespace", "edge_devices", ["namespace"])
    op.create_index("ix_edge_devices_last_seen", "edge_devices", ["last_seen"])
    op.create_table(
        "edge_enroll_tokens",
        sa.Column("token_sha256", sa.String(64), primary_key=True),
        sa.Column("namespace", sa.String(128), nullable=False),
        _ts("created_at"),
        _ts("expires_at"),
        _ts("used_at", nullable=True),
        sa.Column("device_id", sa.String(64), nullable=True),
    )
    op.create_table(
        "edge_revocations",
        sa.Column("serial", sa.String(64), primary_key=True),
        sa.Column("device_id", sa.String(64), nullable=False),
        _ts("revoked_at"),
        sa.Column("reason", sa.String(256), nullable=False, server_default=""),
    )
    op.create_index("ix_edge_revocations_device_id", "edge_revocations", ["device_id"])
    op.create_table(
        "edge_certs",
        sa.Column("serial", sa.String(64), primary_key=True),
        sa.Column("device_id", sa.String(64), nullable=False),
        _ts("not_after"),
    )
    op.create_index("ix_edge_certs_device_id", "edge_certs", ["device_id"])
    op.create_table(
        "edge_uplinks",
        sa.Column("device_id", sa.String(64), primary_key=True),
        sa.Column("msg_id", sa.String(128), primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("ts_ms", sa.BigInteger, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        _ts("received_at"),
    )
    op.create_table(
        "edge_tasks",
        sa.Column("task_id", sa.String(160), primary_key=True),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("device_id", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        _ts("expires_at"),
        _ts("dispatched_at"),
        _ts("updated_at"),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("late_outcome", sa.String(32), nullable=True),
    )
    op.create_index("ix_edge_tasks_job_id", "edge_tasks", ["job_id"])
    op.create_index("ix_edge_tasks_device_id", "edge_tasks", ["device_id"])
    op.create_index("ix_edge_tasks_state", "edge_tasks", ["state"])


def downgrade() -> None:
    for t in ("edge_tasks", "edge_uplinks", "edge_certs", "edge_revocations", "edge_enroll_tokens", "edge_devices"):
        op.drop_table(t)
