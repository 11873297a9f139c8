"""Core tables of the broker: namespaces, tokens, jobs, labels, events, attempts, idempotency keys.

Revision ID: 0001_core
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_core"
down_revision = None
branch_labels = None
depends_on = None

_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts(name: str, nullable: bool = False) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "namespaces",
        sa.Column("name", sa.String(63), primary_key=True),
        _ts("created_at"),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("namespace", sa.String(63), sa.ForeignKey("namespaces.name", ondelete="CASCADE")),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("description", sa.String(200), nullable=False, server_default=""),
        _ts("created_at"),
        _ts("revoked_at", nullable=True),
    )
    op.create_index("ix_tokens_namespace", "tokens", ["namespace"])
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "namespace", sa.String(63), sa.ForeignKey("namespaces.name", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
        _ts("created_at"),
        _ts("updated_at"),
        _ts("not_before", nullable=True),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.Column("vcpus", sa.Float, nullable=False, server_default="0"),
        sa.Column("memory_gib", sa.Float, nullable=False, server_default="0"),
        sa.Column("gpus", sa.Integer, nullable=False, server_default="0"),
        sa.Column("spec_json", sa.Text, nullable=False),
        sa.Column("placement_json", sa.Text),
        sa.Column("provider", sa.String(32)),
        sa.Column("region", sa.String(64)),
        sa.Column("dry_run", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("instances_json", sa.Text),
        sa.Column("request_id", sa.String(64)),
        sa.Column("retries", sa.Integer, nullable=False, server_default="0"),
        sa.Column("held_reason", sa.Text),
        sa.Column("message", sa.Text),
        sa.Column("exit_code", sa.Integer),
    )
    op.create_index("ix_jobs_namespace", "jobs", ["namespace"])
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_index("ix_jobs_provider", "jobs", ["provider"])
    op.create_index("ix_jobs_queue", "jobs", ["state", "priority", "id"])
    op.create_table(
        "job_labels",
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("key", sa.String(317), primary_key=True),
        sa.Column("value", sa.String(63), nullable=False),
    )
    op.create_index("ix_job_labels_kv", "job_labels", ["key", "value"])
    op.create_table(
        "job_events",
        sa.Column("id", _BigId, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        _ts("at"),
        sa.Column("from_state", sa.String(16)),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.Column("data_json", sa.Text),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    op.create_table(
        "attempts",
        sa.Column("id", _BigId, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        _ts("at"),
        sa.Column("request_id", sa.String(64), nullable=False, server_default=""),
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("region", sa.String(64), nullable=False),
        sa.Column("instance_type", sa.String(128), nullable=False),
        sa.Column("capacity", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False, server_default=""),
        sa.Column("delay_seconds", sa.Float, nullable=False, server_default="0"),
        sa.Column("retryable", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_attempts_job_id", "attempts", ["job_id"])
    op.create_table(
        "idempotency_keys",
        sa.Column(
            "namespace", sa.String(63), sa.ForeignKey("namespaces.name", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("request_sha256", sa.String(64), nullable=False),
        sa.Column("status_code", sa.Integer, nullable=False),
        sa.Column("response_json", sa.Text, nullable=False),
        _ts("created_at"),
    )


def downgrade() -> None:
    for table in ("idempotency_keys", "attempts", "job_events", "job_labels", "jobs", "tokens", "namespaces"):
        op.drop_table(table)
