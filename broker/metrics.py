"""Prometheus metrics of one broker app, in its own :class:`CollectorRegistry` (no global state, so tests
and several apps in one process do not collide).

``hb_jobs`` (gauge by namespace and state) is read from the store at scrape time, so it is true across
restarts and replicas; the histograms and counters count what this process saw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["Metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600)


class _JobsByState(Collector):
    def __init__(self, count: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        self._count = count

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("hb_jobs", "Jobs in the store by namespace and state.",
                                   labels=["namespace", "state"])
        try:
            rows = list(self._count())
        except Exception:  # noqa: BLE001 - a scrape must not fail because the store is briefly down
            rows = []
        for namespace, state, n in rows:
            family.add_metric([namespace, state], n)
        yield family


class Metrics:
    """The metrics of one app. ``count_jobs`` returns ``(namespace, state, count)`` rows for ``hb_jobs``."""

    def __init__(self, count_jobs: Callable[[], Iterable[tuple[str, str, int]]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.submitted = Counter(
            "hb_jobs_submitted", "Jobs accepted by the API.", ["namespace"], registry=self.registry
        )
        self.transitions = Counter(
            "hb_job_transitions", "Job state transitions made by this process.", ["to_state"],
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "hb_queue_wait_seconds", "Time from submission to placement.", buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.placement_latency = Histogram(
            "hb_placement_latency_seconds", "Time to compute one job's placement.", buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.cycle_seconds = Histogram(
            "hb_scheduler_cycle_seconds", "Duration of scheduler steps.", ["step"], buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.provider_errors = Counter(
            "hb_provider_errors", "Provider errors by provider and kind.", ["provider", "kind"],
            registry=self.registry,
        )
        self.http_requests = Counter(
            "hb_http_requests", "HTTP requests by method and status class.", ["method", "status"],
            registry=self.registry,
        )
        # --- fleet operations (issue 14: broker.ops.collect sets these each scheduler cycle) ---
        self.utilization = Gauge(
            "hb_utilization_ratio", "Used over capacity (0..1) per pool, host or device and resource.",
            ["scope", "name", "resource"], registry=self.registry,
        )
        self.queue_length = Gauge(
            "hb_queue_length", "PENDING jobs per namespace.", ["namespace"], registry=self.registry
        )
        self.queue_wait_oldest = Gauge(
            "hb_queue_wait_oldest_seconds", "Age of the oldest PENDING job per namespace.", ["namespace"],
            registry=self.registry,
        )
        self.spend_burn = Gauge(
            "hb_spend_usd_per_hour", "Hourly spend of running work by namespace and provider.",
            ["namespace", "provider"], registry=self.registry,
        )
        self.network_bytes = Counter(
            "hb_network_bytes", "Bytes moved for jobs' data, by source and destination provider.",
            ["src", "dst"], registry=self.registry,
        )
        self.edge_link_latency = Gauge(
            "hb_edge_link_latency_seconds", "Last measured round-trip latency of an edge device's link.",
            ["device"], registry=self.registry,
        )
        self.provisioning_latency = Histogram(
            "hb_provisioning_latency_seconds", "Time from PLACED to RUNNING.", buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.failovers = Counter(
            "hb_failovers", "Runs moved elsewhere: lost hosts, failed liveness probes, provider failover.",
            ["reason"], registry=self.registry,
        )
        self.pool_replicas = Gauge(
            "hb_pool_replicas", "Replicas of a broker-owned pool (desired and current).", ["pool", "kind"],
            registry=self.registry,
        )
        self.consolidations = Counter(
            "hb_consolidation", "Pool instances released by consolidation (their work moved).", ["pool"],
            registry=self.registry,
        )
        self.alerts_firing = Gauge(
            "hb_alerts_firing", "Firing alerts by rule and severity.", ["rule", "severity"],
            registry=self.registry,
        )
        self.webhook_deliveries = Counter(
            "hb_alert_webhook_deliveries", "Alert webhook deliveries by outcome.", ["outcome"],
            registry=self.registry,
        )
        # --- end fleet operations ---
        if count_jobs is not None:
            self.registry.register(_JobsByState(count_jobs))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
