"""Filter: the request's provider and region allow-lists (empty = any).

A region entry matches a region name (``eu-west-1``) or a location key (``aws:eu-west-1``)."""

from __future__ import annotations

import numpy as np

from broker.model import Request
from policies.placement.base import Check, Context, isin_codes
from pricing.catalog import Catalog

NAME = "allowlist"
ProviderNotAllowed = "ProviderNotAllowed"
RegionNotAllowed = "RegionNotAllowed"
REASONS = (ProviderNotAllowed, RegionNotAllowed)
def checks(request: Request, catalog: Catalog, ctx: Context) -> list[Check]:
    out: list[Check] = []
    if request.providers:
        codes = np.array([i for i, p in enumerate(catalog.providers) if p in set(request.providers)], dtype=np.int64)
        out.append((ProviderNotAllowed, isin_codes(catalog.provider_code, codes)))
    if request.regions:
        codes = np.flatnonzero(catalog.location_mask(regions=request.regions))
        out.append((RegionNotAllowed, isin_codes(catalog.loc_code, codes)))
    return out
