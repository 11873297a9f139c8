"""What each savings baseline of the placement report needs, computed at decision time from the same catalog,
egress model and constraints as the placement (so a report never has to guess it later).

For a placed request:

* ``on-demand``: the best option with spot excluded (``spot: never``), every other constraint kept (deadline
  included); ``None`` when nothing but spot is feasible. For a request that already excludes spot it is the
  placement itself.
* ``ignore-data``: the naive plan that looks at compute prices only: the best option of the request without its
  data inputs, then priced *with* them (its egress and transfer hours paid) at the same offer. For a request
  without data it is the placement itself.
* ``regions``: ``{provider:region: total USD}`` of the request's best feasible option in every cloud region
  where it is feasible (for the single-region plan: one region for every job).

The values are the :class:`~broker.model.PlacementOption` objects (``regions``: floats); the decision record
stores them as JSON next to the choice. See docs/REPORTS.md for how the report sums them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from broker.model import (
    Capacity,
    InstanceType,
    Location,
    Offer,
    PlacementOption,
    PlacementResult,
    Request,
    SiteKind,
    SpotPolicy,
)
from pricing.catalog import Catalog
from pricing.egress import EgressModel

__all__ = ["decision_baselines", "offer_of", "BASELINE_KEYS"]

BASELINE_KEYS = ("on-demand", "ignore-data", "regions")


def offer_of(option: PlacementOption) -> Offer:
    """The offer an option was priced from (the instance type and location it names)."""
    it = InstanceType(option.instance_type, option.vcpus, option.memory_gib, option.gpus, option.accelerator)
    site = SiteKind(option.site) if option.site in {s.value for s in SiteKind} else SiteKind.CLOUD
    loc = Location(option.provider, option.region, option.zone, site)
    return Offer(it, loc, Capacity(option.capacity), option.hourly_usd)


def decision_baselines(
    request: Request,
    catalog: Catalog,
    egress: EgressModel,
    result: PlacementResult,
    *,
    now: datetime,
    extra_offers: Sequence[Offer] = (),
    wait_hours: float = 0.0,
    risk: Any = None,
) -> dict[str, Any]:
    """The baselines of ``result`` (see module docstring); ``{}`` when nothing was placed."""
    from policies.placement.engine import best_totals_per_location, place, price_offer

    chosen = result.placement
    if chosen is None:
        return {}
    kw: dict[str, Any] = {"now": now, "extra_offers": extra_offers, "wait_hours": wait_hours, "risk": risk}
    if request.spot == SpotPolicy.NEVER:
        on_demand: PlacementOption | None = chosen
    else:
        on_demand = place(dataclasses.replace(request, spot=SpotPolicy.NEVER), catalog, egress, top=0,
                          **kw).placement
    if request.data:
        naive = place(dataclasses.replace(request, data=()), catalog, egress, top=0, **kw).placement
        ignore = chosen if naive is None else price_offer(request, offer_of(naive), egress, wait_hours=wait_hours,
                                                                  risk=risk)
    else:
        ignore = chosen
    regions = {
        loc: total
        for loc, (total, site) in best_totals_per_location(request, catalog, egress, **kw).items()
        if site == SiteKind.CLOUD.value
    }
    return {"on-demand": on_demand, "ignore-data": ignore, "regions": regions}
