"""Pure scheduling decisions over the unified model: placement, queue orderings, admission (quotas,
budgets, priority classes, reservations, deadlines), preemption, gangs, load balancing and batch placement.

Names are imported on first use, so ``import policies`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "place",
    "queue_key",
    "order",
    "admit",
    "find_victims",
    "place_gang",
    "choose_pool",
    "choose_for_deadline",
    "solve_heuristic",
    "solve_exact",
]

_WHERE = {
    "place": "policies.placement",
    "queue_key": "policies.queueing",
    "order": "policies.queueing",
    "admit": "policies.admission",
    "find_victims": "policies.preemption",
    "place_gang": "policies.gang",
    "choose_pool": "policies.loadbalance",
    "choose_for_deadline": "policies.deadline",
    "solve_heuristic": "policies.batch",
    "solve_exact": "policies.batch",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'policies' has no attribute {name!r}")
