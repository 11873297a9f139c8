"""Filter: the spot policy. ``never`` rejects spot offers; ``required`` rejects everything but spot;
``allowed`` takes both."""

from __future__ import annotations

from broker.model import Capacity, Request, SpotPolicy
from policies.placement.base import Check, Context
from pricing.catalog import CAPACITIES, Catalog

NAME = "spot"
SpotPolicyReason = "SpotPolicy"
REASONS = (SpotPolicyReason,)
_SPOT = CAPACITIES.index(Capacity.SPOT)


def checks(request: Request, catalog: Catalog, ctx: Context) -> list[Check]:
    if request.spot == SpotPolicy.NEVER:
        return [(SpotPolicyReason, catalog.cap_code != _SPOT)]
    if request.spot == SpotPolicy.REQUIRED:
        return [(SpotPolicyReason, catalog.cap_code == _SPOT)]
    return []
