"""Wires fleet operations into one app: :func:`install_ops` builds an :class:`OpsService` and hooks it into
the scheduler (one call per cycle, after step 7).

Each cycle: the collector (gauges; samples every ``BROKER_OPS_SAMPLE_SECONDS``, default 60); every
``BROKER_ALERT_EVAL_SECONDS`` (default 60) the alert engine evaluates and delivers; the health monitor
(heartbeats, probes) and the pool autoscaler (the stored pools) run every cycle. Everything reads the app's
clock, so tests and trace replays run in simulated time.

Environment: ``BROKER_ALERT_WEBHOOK_URL`` and ``BROKER_ALERT_WEBHOOK_SECRET`` (both, or neither);
``BROKER_HEARTBEAT_TIMEOUT_SECONDS`` (default 60): silence after which a host is lost;
``BROKER_DEVICE_LOST_AFTER_SECONDS`` (default unset: never): the same for edge devices.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from typing import Any

from broker.ops.alerts import AlertEngine
from broker.ops.collect import Collector
from broker.ops.webhooks import WebhookSender

__all__ = ["OpsService", "install_ops"]

log = logging.getLogger("broker.ops")


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw)
    except ValueError:
        log.error("%s=%r is not a number; using %s", name, raw, default)
        return default


class OpsService:
    """The per-cycle work of fleet operations for one app (see the module docstring)."""

    def __init__(self, state: Any, *, webhook: WebhookSender | None = None) -> None:
        self.state = state
        self.collector = Collector(state, interval_seconds=_float_env("BROKER_OPS_SAMPLE_SECONDS", 60.0))
        if webhook is None:
            url, secret = os.environ.get("BROKER_ALERT_WEBHOOK_URL"), os.environ.get("BROKER_ALERT_WEBHOOK_SECRET")
            if url and secret:
                webhook = WebhookSender(url, secret)
            elif url or secret:
                log.error("alert webhook not configured: set both BROKER_ALERT_WEBHOOK_URL and _SECRET")
        self.alerts = AlertEngine(state.store, state.clock, metrics=state.metrics, webhook=webhook)
        self.alert_interval_seconds = _float_env("BROKER_ALERT_EVAL_SECONDS", 60.0)
        from broker.ops.health import HealthMonitor

        self.health: Any = HealthMonitor(
            state, heartbeat_timeout_seconds=_float_env("BROKER_HEARTBEAT_TIMEOUT_SECONDS", 60.0),
            device_timeout_seconds=_float_env("BROKER_DEVICE_LOST_AFTER_SECONDS", 0.0) or None)
        from broker.ops.autoscale import PoolAutoscaler

        self.autoscaler: Any = PoolAutoscaler(state)
        self.collector.extra.append(self.autoscaler.samples)
        self._last_eval: datetime | None = None
        self._usage_since: datetime | None = None
        self._usage_seen: set[str] = set()

    def __call__(self, now: datetime) -> None:
        if self.health is not None:
            self.health.check(now)
        if self.autoscaler is not None:
            self.autoscaler.reconcile(now)
        if self._usage_since is not None:
            from broker.ops.vpa import collect_onprem_usage

            if len(self._usage_seen) > 100_000:  # bounded; a window start re-read at worst twice
                self._usage_seen.clear()
            collect_onprem_usage(self.state, self._usage_since, now, self._usage_seen)
        self._usage_since = now
        self.collector(now)
        if self._last_eval is None or (now - self._last_eval).total_seconds() >= self.alert_interval_seconds:
            self.alerts.evaluate(now)
            self._last_eval = now
        self.alerts.deliver(now)


def install_ops(state: Any) -> OpsService:
    """Build the :class:`OpsService` of ``state`` (``state.ops``) and hook it into its scheduler."""
    ops = OpsService(state)
    state.ops = ops
    if state.scheduler is not None:
        state.scheduler.cycle_hooks.append(ops)
    return ops
