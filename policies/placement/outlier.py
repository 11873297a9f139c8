"""Filter: offers the catalog flagged as price outliers are skipped unless the request includes them."""

from __future__ import annotations

from broker.model import Request
from policies.placement.base import Check, Context
from pricing.catalog import Catalog

NAME = "outlier"
Outlier = "Outlier"
REASONS = (Outlier,)


def checks(request: Request, catalog: Catalog, ctx: Context) -> list[Check]:
    if request.include_outliers or not catalog.outlier.any():
        return []
    return [(Outlier, ~catalog.outlier)]
