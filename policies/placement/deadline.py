"""Filter (after costing): the job must finish before its deadline.

Finish = now + predicted wait + transfer hours of its data + duration."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

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


def equivalent_request(request: Request, now: datetime, wait_hours: float = 0.0) -> Request:
    """A request that places exactly like ``request`` at ``now`` with ``wait_hours`` of predicted wait: the
    request without its deadline when it has no data inputs and can finish in time.

    The deadline enters placement only through :func:`late_locations`. Without data inputs every location's
    data hours are 0, so the deadline either rejects every location or none; when it rejects none, the
    placement (options, counts, explanation, savings baselines) is that of the request without a deadline,
    which callers can then cache and share across deadlines and decision times. Otherwise ``request``."""
    if request.deadline is None or request.data:
        return request
    if bool(late_locations(request, _NO_DATA_HOURS, Context(now=now, wait_hours=wait_hours))[0]):
        return request
    return replace(request, deadline=None)


_NO_DATA_HOURS = np.zeros(1)
