"""What every placement plugin shares: the :class:`Verdict` value and the :class:`Context` a filter reads.

A *filter* plugin is a module with ``NAME``, its reason constants and ``checks(request, catalog, ctx)``
returning ``[(reason, ok_mask), ...]``: boolean arrays over all catalog rows (``True`` = this row passes
that check). The engine applies the checks in order and counts each rejected row under the first reason
that rejects it, so ``considered == feasible + sum(rejected.values())``.

A *score* plugin has ``NAME`` and ``key(request, costs) -> float array`` (lower is better).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import numpy.typing as npt

from broker.model import Request
from pricing.catalog import Catalog

__all__ = ["Verdict", "Context", "Check", "FilterFn", "Costs", "BoolArray", "isin_codes"]

BoolArray = npt.NDArray[np.bool_]
Check = tuple[str, BoolArray]
FilterFn = Callable[[Request, Catalog, "Context"], list[Check]]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of filtering one offer: ``ok``, or rejected with a reason constant. ``unresolvable``
    means no amount of waiting or preemption makes the offer fit (a resource or policy mismatch)."""

    passed: bool
    reason: str = ""
    unresolvable_: bool = False

    @staticmethod
    def ok() -> Verdict:
        return Verdict(True)

    @staticmethod
    def reject(reason: str) -> Verdict:
        return Verdict(False, reason)

    @staticmethod
    def unresolvable(reason: str) -> Verdict:
        return Verdict(False, reason, True)


@dataclass(frozen=True, slots=True)
class Context:
    """What filters may read besides the request and catalog: the decision time and predicted wait."""

    now: datetime
    wait_hours: float = 0.0


@dataclass(frozen=True, slots=True)
class Costs:
    """Costs of the candidate rows ``idx`` of one catalog (all arrays aligned with ``idx``)."""

    idx: npt.NDArray[np.int64]
    hourly_usd: npt.NDArray[np.float64]
    compute_usd: npt.NDArray[np.float64]
    egress_usd: npt.NDArray[np.float64]
    transfer_hours: npt.NDArray[np.float64]
    total_usd: npt.NDArray[np.float64]  # compute + egress + interruption
    finish_hours: npt.NDArray[np.float64]
    interruption_usd: npt.NDArray[np.float64] | None = None  # expected cost of spot interruptions


_MAX_EQ = 12  # up to this many codes, OR-ed equality tests beat a gather over every row


def isin_codes(col: np.ndarray, codes: np.ndarray) -> BoolArray:
    """``col`` element in ``codes`` (small non-negative integer codes), fast for the few-codes case."""
    if len(codes) == 0:
        return np.zeros(len(col), dtype=bool)
    if len(codes) <= _MAX_EQ:
        # Python ints keep the column's small dtype (no promotion of the whole column to int64).
        first, *rest = (int(c) for c in codes)
        out = col == first
        for c in rest:
            out |= col == c
        return out
    table = np.zeros(max(int(col.max(initial=0)), int(codes.max())) + 1, dtype=bool)
    table[codes] = True
    return table.take(col)
