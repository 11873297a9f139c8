"""Filter: burstable instance types are not placed for sustained work unless the request allows them.

Burstable (shared-core) types run at a CPU *baseline* and bank credits for short bursts: AWS ``t2``/``t3``/
``t3a``/``t4g`` (and the old ``t1``) bill surplus credits in unlimited mode or throttle to 5-40% of a vCPU in
standard mode; Azure B-series (``Standard_B1s`` ... ``Standard_B16als_v2``) throttle to a 5-60% baseline once
their credits are spent; GCP ``e2-micro``/``e2-small``/``e2-medium`` (and the older ``f1-micro``/``g1-small``)
are shared-core with a 12.5-50% sustained share. Their list price buys the baseline, not the whole vCPUs a
batch job asks for, so their hourly price is not the price of the work.

Rule: a request for whole vCPUs (``vcpus`` >= 1 and an integer) is sustained work and rejects these types
(reason ``BurstableType``); a request for a fraction of a vCPU (``0.5``) or for no CPU at all, or one with
``placement.burstable: allowed`` (``Request.allow_burstable``), takes them. The families are matched by
instance type name (a conservative list: only the published burstable families).
"""

from __future__ import annotations

import re

import numpy as np

from broker.model import Request
from policies.placement.base import Check, Context
from pricing.catalog import Catalog

__all__ = ["NAME", "BurstableType", "REASONS", "is_burstable", "sustained", "checks", "row_mask"]

NAME = "burstable"
BurstableType = "BurstableType"
REASONS = (BurstableType,)

_BURSTABLE = re.compile(
    r"^(t1\.|t2\.|t3\.|t3a\.|t4g\."  # AWS
    r"|Standard_B\d"  # Azure B-series (B1s, B2ms, B4as_v2, B2pts_v2, ...)
    r"|e2-(micro|small|medium)$|f1-micro$|g1-small$)",  # GCP shared-core
)


def is_burstable(type_name: str) -> bool:
    """Whether ``type_name`` belongs to a burstable (CPU-credit / shared-core) family."""
    return _BURSTABLE.match(type_name) is not None


def sustained(request: Request) -> bool:
    """Whether ``request`` asks for whole vCPUs (sustained work): ``vcpus`` >= 1 and an integer."""
    return request.vcpus >= 1 and float(request.vcpus).is_integer()


def row_mask(catalog: Catalog) -> np.ndarray:
    """Per row of ``catalog``: its type is burstable (computed once per catalog object)."""
    def build() -> np.ndarray:
        per_type = np.fromiter((is_burstable(t) for t in catalog.type_names), bool, len(catalog.type_names))
        out = per_type.take(catalog.type_code) if len(catalog) else np.zeros(0, dtype=bool)
        out.setflags(write=False)
        return out

    return catalog.derived("burstable-rows", build)  # type: ignore[no-any-return]


def checks(request: Request, catalog: Catalog, ctx: Context) -> list[Check]:
    if request.allow_burstable or not sustained(request):
        return []
    mask = row_mask(catalog)
    if not mask.any():
        return []
    return [(BurstableType, ~mask)]
