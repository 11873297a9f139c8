"""Wires fleet operations into one app: :func:`install_ops` builds an :class:`OpsService` and hooks it into
the scheduler (one call per cycle, after step 7).

Each cycle: the collector (gauges; samples every ``BROKER_OPS_SAMPLE_SECONDS``, default 60); every
``BROKER_ALERT_EVAL_SECONDS`` (default 60) the alert engine evaluates and delivers; the health monitor
(heartbeats, probes), the pool autoscaler (the stored pools) and consolidation (:mod:`broker.ops.warm`) run
every cycle; :func:`install_ops` also gives the scheduler its warm-pool hook. Everything reads the app's
clock, so tests and trace replays run in simulated time.

Environment: ``BROKER_ALERT_WEBHOOK_URL`` and ``BROKER_ALERT_WEBHOOK_SECRET`` (both, or neither);
``BROKER_HEARTBEAT_TIMEOUT_SECONDS`` (default 60): silence after which a host is lost;
``BROKER_DEVICE_LOST_AFTER_SECONDS`` (default unset: never): the same for edge devices.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from broker.ops.alerts import AlertEngine
from broker.ops.collect import Collector
from broker.ops.webhooks import WebhookSender

__all__ = ["OpsService", "install_ops"]

class OpsService:
    """The per-cycle work of fleet operations for one app (see the module docstring)."""

    def __init__(self, state: Any, *, webhook: WebhookSender | None = None) -> None:
        self.state = state
        settings = state.settings  # BROKER_OPS_* / BROKER_ALERT_* / ..., validated by broker.config
        self.collector = Collector(state, interval_seconds=settings.ops_sample_seconds)
        if webhook is None and settings.alert_webhook_url and settings.alert_webhook_secret:
            webhook = WebhookSender(settings.alert_webhook_url, settings.alert_webhook_secret)
        self.alerts = AlertEngine(state.store, state.clock, metrics=state.metrics, webhook=webhook)
        self.alert_interval_seconds = settings.alert_eval_seconds
        from broker.ops.health import HealthMonitor

        self.health: Any = HealthMonitor(
            state, heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
            device_timeout_seconds=settings.device_lost_after_seconds)
        from broker.ops.autoscale import PoolAutoscaler

        self.autoscaler: Any = PoolAutoscaler(state)
        self.collector.extra.append(self.autoscaler.samples)
        from broker.ops.warm import Consolidator, WarmPools

        self.warm = WarmPools(state)  # the scheduler's warm-pool hook (install_ops)
        self.consolidator: Any = Consolidator(state, self.warm)
        self._last_eval: datetime | None = None
        self._usage_since: datetime | None = None
        self._usage_seen: set[str] = set()

    def __call__(self, now: datetime) -> None:
        if self.health is not None:
            self.health.check(now)
        if self.autoscaler is not None:
            self.autoscaler.reconcile(now)
        if self.consolidator is not None:
            self.consolidator(now)
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
        state.scheduler.warm = ops.warm
    return ops
