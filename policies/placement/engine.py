"""The placement engine: filters -> costs -> deadline -> ranking -> diverse alternatives.

Cost model (all USD for the whole job, all ``nodes``):

* ``transfer_hours`` = sum over data inputs of size / bandwidth(input location -> offer location)
  (inputs are copied one after the other; 0 for an input already there);
* ``compute_usd`` = hourly_usd x nodes x (duration_hours + transfer_hours): the nodes are paid while the
  data arrives;
* ``egress_usd`` = sum over inputs of the tiered egress price of moving it once to the offer's location
  (gang nodes share one copy);
* ``total_usd`` = compute + egress; ``finish_hours`` = wait_hours + transfer_hours + duration_hours.

Ranking: by the request's objective (``cost``: total, then finish; ``time``: finish, then total). The
placement is the best option; alternatives are the next best in rank order, first one per distinct
(provider, region), then filled with distinct (location, instance type, capacity) when fewer regions exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache

import numpy as np

from broker.errors import SpecError
from broker.model import Offer, PlacementOption, PlacementResult, Provenance, Request
from policies.placement import (
    accelerator,
    allowlist,
    arch,
    cost,
    deadline,
    finish_time,
    fit,
    outlier,
    price_cap,
    spot,
)
from policies.placement.base import Context, Costs, FilterFn, Verdict
from policies.placement.explain import explain
from pricing.catalog import CAPACITIES, Catalog
from pricing.egress import EgressModel
from pricing.geo import continent_of

__all__ = ["place", "check_offer", "FILTERS", "SCORES", "REASONS"]

# Filter plugins in the order they are applied (a row is counted under the first reason that rejects it).
FILTERS: dict[str, FilterFn] = {
    allowlist.NAME: allowlist.checks,
    spot.NAME: spot.checks,
    arch.NAME: arch.checks,
    accelerator.NAME: accelerator.checks,
    fit.NAME: fit.checks,
    outlier.NAME: outlier.checks,
    price_cap.NAME: price_cap.checks,
}
SCORES = {cost.NAME: cost.keys, finish_time.NAME: finish_time.keys}
REASONS: tuple[str, ...] = (
    *allowlist.REASONS, *spot.REASONS, *arch.REASONS, *accelerator.REASONS, *fit.REASONS, *outlier.REASONS,
    *price_cap.REASONS, *deadline.REASONS,
)
_CANDIDATES = 256  # rows ranked per round; doubled until enough diverse alternatives are found


@lru_cache(maxsize=16)
def _extra_catalog(offers: tuple[Offer, ...]) -> Catalog:
    return Catalog.from_offers(offers, Provenance(source="extra", date="", provider=""))


def _validate(request: Request, parts: Sequence[Catalog], egress: EgressModel) -> None:
    """Data locations must be known: a catalog location, an inventory site, or a region of a known cloud
    that the region tables recognise. (Accelerator names are checked by the spec parser; one that no offer
    carries simply rejects every offer with ``AcceleratorMismatch``.)"""
    for i, d in enumerate(request.data):
        if any(p.has_location(d.location) for p in parts) or d.location in egress.sites:
            continue
        provider, _, region = d.location.partition(":")
        if provider in egress.config.get("providers", {}) and continent_of(provider, region):
            continue
        raise SpecError(
            f"spec.data[{i}].location",
            f"location {d.location!r} is not in the catalog or the on-prem inventory. "
            "To fix: use provider:region of a known region (e.g. aws:us-east-1) or an inventory site",
        )
    if request.nodes < 1 or request.duration_hours < 0:
        raise SpecError("spec", "nodes must be >= 1 and durationHours >= 0")


def _costs(request: Request, cat: Catalog, idx: np.ndarray, egress: EgressModel, wait_hours: float) -> Costs:
    n_loc = len(cat.locations)
    egress_loc = np.zeros(n_loc)
    hours_loc = np.zeros(n_loc)
    for d in request.data:
        usd, hrs = egress.to_locations(d.location, d.size_gib, cat.locations)
        egress_loc += usd
        hours_loc += hrs
    loc = cat.loc_code[idx]
    hourly = cat.hourly_usd[idx]
    transfer = hours_loc[loc]
    egress_usd = egress_loc[loc]
    compute = hourly * request.nodes * (request.duration_hours + transfer)
    return Costs(
        idx=idx, hourly_usd=hourly, compute_usd=compute, egress_usd=egress_usd, transfer_hours=transfer,
        total_usd=compute + egress_usd, finish_hours=wait_hours + transfer + request.duration_hours,
    )


def _prefix(alive: np.ndarray, n_alive: int, top: int) -> np.ndarray:
    """Indices of the first feasible rows, enough to find ``top + 1`` distinct regions in practice:
    grows until it holds that many distinct rows' worth of candidates or all of them."""
    want = max(_CANDIDATES, 64 * (top + 1))
    if n_alive <= want:
        return np.flatnonzero(alive)
    # Scan in growing windows so a cheap feasible prefix is found without touching every row.
    stop = want
    n = len(alive)
    while True:
        hits = np.flatnonzero(alive[:stop])
        if len(hits) >= want or stop >= n:
            return hits[:want]
        stop = min(n, stop * 4)


def _option(cat: Catalog, c: Costs, j: int) -> PlacementOption:
    i = int(c.idx[j])
    loc = cat.locations[int(cat.loc_code[i])]
    acc = cat.accelerators[int(cat.acc_code[i])] or None
    return PlacementOption(
        provider=loc.provider,
        region=loc.region,
        zone=cat.zones[int(cat.zone_code[i])] or None,
        instance_type=cat.type_names[int(cat.type_code[i])],
        capacity=CAPACITIES[int(cat.cap_code[i])].value,
        vcpus=float(cat.vcpus[i]),
        memory_gib=float(cat.memory_gib[i]),
        gpus=int(cat.gpus[i]),
        accelerator=acc,
        hourly_usd=float(c.hourly_usd[j]),
        compute_usd=float(c.compute_usd[j]),
        egress_usd=float(c.egress_usd[j]),
        transfer_hours=float(c.transfer_hours[j]),
        total_usd=float(c.total_usd[j]),
        site=loc.site.value,
        finish_hours=float(c.finish_hours[j]),
    )


def place(
    request: Request,
    catalog: Catalog,
    egress: EgressModel,
    *,
    top: int = 5,
    now: datetime | None = None,
    extra_offers: Sequence[Offer] = (),
    wait_hours: float = 0.0,
) -> PlacementResult:
    """The best placement of ``request`` over ``catalog`` (plus ``extra_offers``: on-prem/edge capacity
    available now) and up to ``top`` ranked, diverse alternatives.

    ``now`` (UTC, default the current time) and ``wait_hours`` (predicted queue wait) judge the deadline.
    ``placement`` is ``None`` when nothing is feasible; ``rejected`` then says why, per reason constant.
    Raises :class:`SpecError` (field ``spec.data[i].location``) for a data location that neither the
    catalog, the inventory nor the region tables know. Pure: reads its arguments only.
    """
    now = now or datetime.now(UTC)
    ctx = Context(now=now, wait_hours=wait_hours)
    parts = [catalog] + ([_extra_catalog(tuple(extra_offers))] if extra_offers else [])
    _validate(request, parts, egress)
    objective = SCORES.get(str(request.objective), cost.keys)
    rejected: dict[str, int] = {}
    considered = 0
    pools: list[tuple[Catalog, Costs]] = []
    extra_feasible = [0]  # feasible rows not costed (compute-only fast path)
    for cat in parts:
        considered += len(cat)
        alive = np.ones(len(cat), dtype=bool)
        for fn in FILTERS.values():
            for reason, ok in fn(request, cat, ctx):
                bad = int(np.count_nonzero(alive & ~ok))
                if bad:
                    rejected[reason] = rejected.get(reason, 0) + bad
                    alive &= ok
        if request.data:
            idx = np.flatnonzero(alive)
        else:
            # Compute-only: every row costs hourly x nodes x duration and finishes at the same time, and the
            # catalog is sorted by hourly price, so the first feasible rows are the best ones. Cost only a
            # prefix (enough for diverse alternatives); count the rest as feasible.
            n_alive = int(np.count_nonzero(alive))
            if request.deadline is not None and not deadline.ok(
                request, _costs(request, cat, np.zeros(1, dtype=np.int64), egress, wait_hours), ctx
            )[0]:
                rejected[deadline.DeadlineMiss] = rejected.get(deadline.DeadlineMiss, 0) + n_alive
                pools.append((cat, _costs(request, cat, np.zeros(0, dtype=np.int64), egress, wait_hours)))
                continue
            idx = _prefix(alive, n_alive, top)
            extra_feasible[0] += n_alive - len(idx)
        c = _costs(request, cat, idx, egress, wait_hours)
        in_time = deadline.ok(request, c, ctx)
        late = int(np.count_nonzero(~in_time))
        if late:
            rejected[deadline.DeadlineMiss] = rejected.get(deadline.DeadlineMiss, 0) + late
            keep = np.flatnonzero(in_time)
            c = Costs(*(getattr(c, f)[keep] for f in Costs.__dataclass_fields__))
        pools.append((cat, c))
    feasible = sum(len(c.idx) for _, c in pools) + extra_feasible[0]
    if feasible == 0:
        res = PlacementResult(job=request.name, placement=None, considered=considered, feasible=0,
                              rejected=rejected, catalog_version=catalog.version)
        return _with_explanation(res)
    chosen = _rank(request, pools, objective, top + 1)
    res = PlacementResult(
        job=request.name,
        placement=chosen[0],
        alternatives=tuple(chosen[1:]),
        considered=considered,
        feasible=feasible,
        rejected=rejected,
        catalog_version=catalog.version,
    )
    return _with_explanation(res)


def _with_explanation(res: PlacementResult) -> PlacementResult:
    from dataclasses import replace

    return replace(res, explanation=explain(res))


def _rank(request: Request, pools: list[tuple[Catalog, Costs]], objective: object, want: int) -> list[PlacementOption]:
    """``want`` options: the best, then diverse alternatives in rank order (see module docstring)."""
    k = _CANDIDATES
    total = sum(len(c.idx) for _, c in pools)
    while True:
        keys: list[list[np.ndarray]] = []
        cols: dict[str, list[np.ndarray]] = {"pool": [], "j": [], "row": [], "reg": [], "ltc": []}
        for p, (cat, c) in enumerate(pools):
            ks = objective(request, c)  # type: ignore[operator]
            n = len(c.idx)
            take = np.arange(n) if n <= k else np.argpartition(ks[0], k)[:k]
            rows = c.idx[take]
            keys.append([kk[take] for kk in ks])
            cols["pool"].append(np.full(len(take), p))
            cols["j"].append(take)
            cols["row"].append(rows)
            reg = cat.loc_code[rows].astype(np.int64) + p * (1 << 40)
            cols["reg"].append(reg)
            cols["ltc"].append((reg * (len(cat.type_names) + 1) + cat.type_code[rows]) * 8 + cat.cap_code[rows])
        cat_keys = [np.concatenate([kl[i] for kl in keys]) for i in range(len(keys[0]))]
        cc = {name: np.concatenate(v) for name, v in cols.items()}
        order = np.lexsort((cc["row"], cc["pool"], *reversed(cat_keys)))
        reg_sorted = cc["reg"][order]
        _, first = np.unique(reg_sorted, return_index=True)
        first.sort()
        picked = list(first[:want])
        if len(picked) < want:
            _, first_ltc = np.unique(cc["ltc"][order], return_index=True)
            extra = np.setdiff1d(first_ltc, first[:want])
            picked = sorted(picked + list(extra[: want - len(picked)]))
        if len(picked) == want or k >= total:
            break
        k *= 8
    out = []
    for pos in picked:
        r = order[int(pos)]
        p = int(cc["pool"][r])
        out.append(_option(pools[p][0], pools[p][1], int(cc["j"][r])))
    return out


def check_offer(
    request: Request, offer: Offer, egress: EgressModel, *, now: datetime | None = None, wait_hours: float = 0.0
) -> Verdict:
    """The verdict of every filter (deadline included) on one offer: :meth:`Verdict.ok` or the first reason
    that rejects it. Slow path for explanations and tests."""
    now = now or datetime.now(UTC)
    ctx = Context(now=now, wait_hours=wait_hours)
    cat = _extra_catalog((offer,))
    for fn in FILTERS.values():
        for reason, ok in fn(request, cat, ctx):
            if not bool(ok[0]):
                return Verdict.unresolvable(reason)
    c = _costs(request, cat, np.arange(1), egress, wait_hours)
    if not bool(deadline.ok(request, c, ctx)[0]):
        return Verdict.reject(deadline.DeadlineMiss)
    return Verdict.ok()
