"""Filter: the hourly price of one node is at most ``max_hourly_usd``."""

from __future__ import annotations

from broker.model import Request
from policies.placement.base import Check, Context
from pricing.catalog import Catalog

NAME = "price_cap"
OverPriceCap = "OverPriceCap"
REASONS = (OverPriceCap,)


def limit(request: Request) -> float | None:
    """The highest hourly price that passes (inclusive), ``None`` without a cap. The catalog is sorted by
    price, so the passing rows are the prefix ``hourly_usd <= limit`` (the engine uses that)."""
    if request.max_hourly_usd is None:
        return None
    return request.max_hourly_usd + 1e-12


def checks(request: Request, catalog: Catalog, ctx: Context) -> list[Check]:
    cap = limit(request)
    if cap is None:
        return []
    return [(OverPriceCap, catalog.hourly_usd <= cap)]
