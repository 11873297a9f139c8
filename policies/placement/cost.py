"""Score: total USD of the job (compute over duration and transfer, plus egress); lower is better.
Ties go to the earlier finish."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from broker.model import Request
from policies.placement.base import Costs

NAME = "cost"


def keys(request: Request, costs: Costs) -> tuple[npt.NDArray[np.float64], ...]:
    """Sort keys, most significant first."""
    return (costs.total_usd, costs.finish_hours)
