"""Operating the fleet (issue 14): metric history, alerts with anomaly detection and root cause, elastic
pools, health probes and heartbeats, trace replay and planning.

Each concept is one module; importing this package imports none of them (the server extra is needed by
most). The tables are in :mod:`broker.ops.store`.
"""

from __future__ import annotations

__all__ = [
    "store", "samples", "collect", "rules", "anomaly", "alerts", "topology", "webhooks",
    "forecast", "autoscale", "poolsim", "vpa", "probes", "health", "replay", "history", "service",
]
