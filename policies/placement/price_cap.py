"""Filter: the hourly price of one node is at most ``max_hourly_usd``."""

from __future__ import annotations

from broker.model import Request
from policies.placement.base import Check, Context
from pricing.catalog import Catalog

NAME = "price_cap"
OverPriceCap = "OverPriceCap"
REASONS = (OverPriceCap,)


def checks(request: Request, catalog: Catalog, ctx: Context) -> list[Check]:
    if request.max_hourly_usd is None:
        return []
    return [(OverPriceCap, catalog.hourly_usd <= request.max_hourly_usd + 1e-12)]
