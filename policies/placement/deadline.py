"""Filter (after costing): the job must finish before its deadline.

Finish = now + predicted wait + transfer hours of its data + duration."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from broker.model import Request
from policies.placement.base import Context, Costs

NAME = "deadline"
DeadlineMiss = "DeadlineMiss"
REASONS = (DeadlineMiss,)


def ok(request: Request, costs: Costs, ctx: Context) -> npt.NDArray[np.bool_]:
    """Per candidate: finishes in time (all ``True`` without a deadline)."""
    if request.deadline is None:
        return np.ones(len(costs.idx), dtype=bool)
    budget_h = (request.deadline - ctx.now).total_seconds() / 3600.0
    return costs.finish_hours <= budget_h + 1e-9


def late_locations(request: Request, loc_hours: npt.NDArray[np.float64], ctx: Context) -> npt.NDArray[np.bool_]:
    """Per location (given the hours its data takes to arrive there): the job cannot finish in time.
    Finish depends only on the location, so the engine rejects whole locations at once."""
    if request.deadline is None:
        return np.zeros(len(loc_hours), dtype=bool)
    budget_h = (request.deadline - ctx.now).total_seconds() / 3600.0
    return ctx.wait_hours + loc_hours + request.duration_hours > budget_h + 1e-9
