"""QoS classes derived from requests and limits exactly as Kubernetes derives a Pod's QoS class.

A job is one container here. Only ``cpu`` and ``memory`` count (extended resources such as GPUs do not):

* **Guaranteed**: both cpu and memory have a limit, and each request equals its limit (a missing request
  defaults to the limit).
* **BestEffort**: no cpu or memory request or limit at all.
* **Burstable**: anything else.

:func:`qos_rank` orders victims for preemption: BestEffort (0) goes before Burstable (1) before
Guaranteed (2).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

__all__ = ["QoSClass", "qos_class", "qos_rank"]

_COUNTED = ("cpu", "memory")


class QoSClass(StrEnum):
    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BEST_EFFORT = "BestEffort"


_RANK = {QoSClass.BEST_EFFORT: 0, QoSClass.BURSTABLE: 1, QoSClass.GUARANTEED: 2}


def qos_class(requests: Mapping[str, float], limits: Mapping[str, float]) -> QoSClass:
    """The QoS class of a job with these per-node ``requests`` and ``limits`` (zero values count as unset,
    as Kubernetes ignores zero quantities)."""
    req = {k: float(v) for k, v in requests.items() if k in _COUNTED and float(v) != 0.0}
    lim = {k: float(v) for k, v in limits.items() if k in _COUNTED and float(v) != 0.0}
    if not req and not lim:
        return QoSClass.BEST_EFFORT
    if all(k in lim for k in _COUNTED) and all(req.get(k, lim[k]) == lim[k] for k in _COUNTED):
        return QoSClass.GUARANTEED
    return QoSClass.BURSTABLE


def qos_rank(qos: QoSClass) -> int:
    """0 for BestEffort, 1 Burstable, 2 Guaranteed: lower is preempted first."""
    return _RANK[qos]
