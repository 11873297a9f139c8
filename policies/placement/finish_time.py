"""Score: predicted finish time (wait + transfer + duration); lower is better. Cost breaks ties."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from broker.model import Request
from policies.placement.base import Costs

NAME = "time"


def keys(request: Request, costs: Costs) -> tuple[npt.NDArray[np.float64], ...]:
    """Sort keys, most significant first (finish rounded to the second so that cost decides near-ties)."""
    return (np.round(costs.finish_hours * 3600.0), costs.total_usd)
