"""The tables of fleet operations: metric samples, host heartbeats, probe states, pools, alert rules and
alerts. Declared like :mod:`broker.store` (SQLModel, UTC timestamps) and created by migration
``0006_issue14_ops``.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from broker.store import utc_column

__all__ = [
    "MetricSampleRow", "HeartbeatRow", "ProbeStateRow", "PoolRow", "AlertRuleRow", "AlertRow",
]

_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class MetricSampleRow(SQLModel, table=True):
    """One sample of one series: ``name`` plus ``labels`` (canonical ``k=v,k=v``, sorted by key)."""

    __tablename__ = "metric_samples"
    __table_args__ = (sa.Index("ix_metric_samples_series", "name", "labels", "at"),)
    id: int | None = Field(default=None, sa_column=sa.Column(_BigId, primary_key=True, autoincrement=True))
    at: datetime = utc_column(index=True)
    name: str = Field(sa_column=sa.Column(sa.String(128), nullable=False))
    labels: str = Field(default="", sa_column=sa.Column(sa.String(512), nullable=False, default=""))
    value: float = Field(sa_column=sa.Column(sa.Float, nullable=False))


class HeartbeatRow(SQLModel, table=True):
    """The last heartbeat of a host (edge devices keep theirs in ``edge_devices.last_seen``).

    ``epoch`` grows each time the host is declared lost: runs started under an older epoch are fenced."""

    __tablename__ = "heartbeats"
    kind: str = Field(sa_column=sa.Column(sa.String(16), primary_key=True))
    name: str = Field(sa_column=sa.Column(sa.String(128), primary_key=True))
    last_seen_at: datetime = utc_column()
    status: str = Field(default="alive", sa_column=sa.Column(sa.String(16), nullable=False, default="alive"))
    lost_at: datetime | None = utc_column(nullable=True)
    epoch: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, default=0))


class ProbeStateRow(SQLModel, table=True):
    """Consecutive results of one probe of one job's current run (``request_id``)."""

    __tablename__ = "probe_states"
    job_id: str = Field(
        sa_column=sa.Column(sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    )
    probe: str = Field(sa_column=sa.Column(sa.String(16), primary_key=True))
    request_id: str = Field(default="", sa_column=sa.Column(sa.String(64), nullable=False, default=""))
    failures: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, default=0))
    successes: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, default=0))
    ready: bool = Field(default=False, sa_column=sa.Column(sa.Boolean, nullable=False, default=False))
    last_at: datetime | None = utc_column(nullable=True)
    message: str = Field(default="", sa_column=sa.Column(sa.Text, nullable=False, default=""))


class PoolRow(SQLModel, table=True):
    """A cloud pool the broker owns: instances kept warm for a namespace or queue."""

    __tablename__ = "pools"
    name: str = Field(sa_column=sa.Column(sa.String(63), primary_key=True))
    namespace: str = Field(default="", sa_column=sa.Column(sa.String(63), nullable=False, default=""))
    queue: str = Field(default="", sa_column=sa.Column(sa.String(63), nullable=False, default=""))
    provider: str = Field(sa_column=sa.Column(sa.String(32), nullable=False))
    region: str = Field(default="", sa_column=sa.Column(sa.String(64), nullable=False, default=""))
    instance_type: str = Field(sa_column=sa.Column(sa.String(128), nullable=False))
    hourly_usd: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False, default=0.0))
    min_replicas: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, default=0))
    max_replicas: int = Field(default=10, sa_column=sa.Column(sa.Integer, nullable=False, default=10))
    desired: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, default=0))
    policy_json: str = Field(default="{}", sa_column=sa.Column(sa.Text, nullable=False, default="{}"))
    instances_json: str = Field(default="[]", sa_column=sa.Column(sa.Text, nullable=False, default="[]"))
    recommendations_json: str = Field(default="[]", sa_column=sa.Column(sa.Text, nullable=False, default="[]"))
    last_scale_at: datetime | None = utc_column(nullable=True)
    updated_at: datetime = utc_column()


class AlertRuleRow(SQLModel, table=True):
    """One group of alert rules as YAML (what ``PUT /v1/ops/alert-rules/{name}`` stored, validated)."""

    __tablename__ = "alert_rules"
    name: str = Field(sa_column=sa.Column(sa.String(63), primary_key=True))
    yaml_text: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    updated_at: datetime = utc_column()


class AlertRow(SQLModel, table=True):
    """One alert instance (a rule x a label set): pending -> firing -> resolved, plus its delivery."""

    __tablename__ = "alerts"
    id: int | None = Field(default=None, sa_column=sa.Column(_BigId, primary_key=True, autoincrement=True))
    fingerprint: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, index=True))
    rule: str = Field(sa_column=sa.Column(sa.String(128), nullable=False))
    severity: str = Field(default="warning", sa_column=sa.Column(sa.String(16), nullable=False, default="warning"))
    state: str = Field(sa_column=sa.Column(sa.String(16), nullable=False, index=True))
    labels: str = Field(default="", sa_column=sa.Column(sa.String(512), nullable=False, default=""))
    value: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False, default=0.0))
    summary: str = Field(default="", sa_column=sa.Column(sa.Text, nullable=False, default=""))
    started_at: datetime = utc_column()
    fired_at: datetime | None = utc_column(nullable=True)
    resolved_at: datetime | None = utc_column(nullable=True)
    group_key: str = Field(default="", sa_column=sa.Column(sa.String(512), nullable=False, default=""))
    root_cause: str = Field(default="", sa_column=sa.Column(sa.String(512), nullable=False, default=""))
    delivered: bool = Field(default=False, sa_column=sa.Column(sa.Boolean, nullable=False, default=False))
    delivery_attempts: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, default=0))
    next_delivery_at: datetime | None = utc_column(nullable=True)
    delivery_error: str = Field(default="", sa_column=sa.Column(sa.Text, nullable=False, default=""))
