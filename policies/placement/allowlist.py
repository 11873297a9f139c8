"""Filter: the request's provider and region allow-lists (empty = any)."""

from __future__ import annotations

from broker.model import Request
from policies.placement.base import Check, Context
from pricing.catalog import Catalog

NAME = "allowlist"
ProviderNotAllowed = "ProviderNotAllowed"
RegionNotAllowed = "RegionNotAllowed"
REASONS = (ProviderNotAllowed, RegionNotAllowed)


def checks(request: Request, catalog: Catalog, ctx: Context) -> list[Check]:
    out: list[Check] = []
    if request.providers:
        out.append((ProviderNotAllowed, catalog.location_mask(providers=request.providers)[catalog.loc_code]))
    if request.regions:
        out.append((RegionNotAllowed, catalog.location_mask(regions=request.regions)[catalog.loc_code]))
    return out
