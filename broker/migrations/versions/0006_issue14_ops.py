"""Fleet operations (issue 14): metric samples, heartbeats, probe states, pools, alert rules and alerts.

Revision ID: 0006_issue14_ops
Revises: 0005_queues
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_issue14_ops"
down_revision = "0005_queues"
branch_labels = None
depends_on = None

_ts = sa.DateTime(timezone=True)
_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Create the tables exactly as ``broker.ops.store`` declares them."""
    op.create_table(
        "metric_samples",
        sa.Column("id", _id, primary_key=True, autoincrement=True),
        sa.Column("at", _ts, nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("labels", sa.String(512), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
    )
    op.create_index("ix_metric_samples_at", "metric_samples", ["at"])
    op.create_index("ix_metric_samples_series", "metric_samples", ["name", "labels", "at"])
    op.create_table(
        "heartbeats",
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("last_seen_at", _ts, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("lost_at", _ts, nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=False),
    )
    op.create_table(
        "probe_states",
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("probe", sa.String(16), primary_key=True),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("successes", sa.Integer(), nullable=False),
        sa.Column("ready", sa.Boolean(), nullable=False),
        sa.Column("last_at", _ts, nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
    )
    op.create_table(
        "pools",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("queue", sa.String(63), nullable=False),
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("region", sa.String(64), nullable=False),
        sa.Column("instance_type", sa.String(128), nullable=False),
        sa.Column("hourly_usd", sa.Float(), nullable=False),
        sa.Column("min_replicas", sa.Integer(), nullable=False),
        sa.Column("max_replicas", sa.Integer(), nullable=False),
        sa.Column("desired", sa.Integer(), nullable=False),
        sa.Column("policy_json", sa.Text(), nullable=False),
        sa.Column("instances_json", sa.Text(), nullable=False),
        sa.Column("recommendations_json", sa.Text(), nullable=False),
        sa.Column("last_scale_at", _ts, nullable=True),
        sa.Column("updated_at", _ts, nullable=False),
    )
    op.create_table(
        "alert_rules",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("yaml_text", sa.Text(), nullable=False),
        sa.Column("updated_at", _ts, nullable=False),
    )
    op.create_table(
        "alerts",
        sa.Column("id", _id, primary_key=True, autoincrement=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("rule", sa.String(128), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("labels", sa.String(512), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("started_at", _ts, nullable=False),
        sa.Column("fired_at", _ts, nullable=True),
        sa.Column("resolved_at", _ts, nullable=True),
        sa.Column("group_key", sa.String(512), nullable=False),
        sa.Column("root_cause", sa.String(512), nullable=False),
        sa.Column("delivered", sa.Boolean(), nullable=False),
        sa.Column("delivery_attempts", sa.Integer(), nullable=False),
        sa.Column("next_delivery_at", _ts, nullable=True),
        sa.Column("delivery_error", sa.Text(), nullable=False),
    )
    op.create_index("ix_alerts_fingerprint", "alerts", ["fingerprint"])
    op.create_index("ix_alerts_state", "alerts", ["state"])


def downgrade() -> None:
    for table in ("alerts", "alert_rules", "pools", "probe_states", "heartbeats", "metric_samples"):
        op.drop_table(table)
