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
from policies.placement.base import Context, Costs, FilterFn, Verdict, isin_codes
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
_CANDIDATES = 256  # rows ranked per round; widened until enough diverse alternatives are found
_SCAN_STEP = 1024  # first price-ordered window of _scan (tests shrink it to exercise the bound logic)


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


def _loc_costs(request: Request, cat: Catalog, egress: EgressModel) -> tuple[np.ndarray, np.ndarray]:
    """Per catalog location: USD of moving every data input there, and hours it takes."""
    usd = np.zeros(len(cat.locations))
    hours = np.zeros(len(cat.locations))
    for d in request.data:
        u, h = egress.to_locations(d.location, d.size_gib, cat.locations)
        usd += u
        hours += h
    return usd, hours


def _costs(request: Request, cat: Catalog, idx: np.ndarray, loc_usd: np.ndarray, loc_hours: np.ndarray,
           wait_hours: float) -> Costs:
    loc = cat.loc_code[idx]
    hourly = cat.hourly_usd[idx]
    transfer = loc_hours[loc]
    egress_usd = loc_usd[loc]
    compute = hourly * request.nodes * (request.duration_hours + transfer)
    return Costs(
        idx=idx, hourly_usd=hourly, compute_usd=compute, egress_usd=egress_usd, transfer_hours=transfer,
        total_usd=compute + egress_usd, finish_hours=wait_hours + transfer + request.duration_hours,
    )


def _scan(request: Request, cat: Catalog, alive: np.ndarray, loc_usd: np.ndarray, loc_hours: np.ndarray,
          wait_hours: float, want: int) -> Costs:
    """Costs of a subset of the feasible rows that provably holds the ``want`` best diverse options by cost.

    Design choice: the catalog is sorted by hourly price and a row's total is ``hourly x A[loc] + B[loc]``
    (``A`` = node-hours incl. transfer, ``B`` = egress). Scan a growing price-ordered prefix until ``want``
    diverse picks exist; a later row of location ``L`` costs at least ``hourly[stop] x A[L] + B[L]``, so only
    locations where that bound is within the dearest pick stay open. When none does, the prefix is final;
    when a few do (the data's own region, typically), their remaining rows are added in one masked pass.
    Thousands of rows get costed instead of every feasible one, and the answer is exact."""
    n = len(alive)
    a_loc = request.nodes * (request.duration_hours + loc_hours)
    pos, step = 0, _SCAN_STEP
    chunks: list[np.ndarray] = []
    count = 0
    while True:
        stop = min(n, pos + step)
        new = np.flatnonzero(alive[pos:stop])
        if len(new):
            chunks.append(new + pos)
            count += len(new)
        pos = stop
        if count >= want or pos >= n:
            hits = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
            c = _costs(request, cat, hits, loc_usd, loc_hours, wait_hours)
            if pos >= n:
                return c
            picks = _pick(request, [(cat, c)], cost.keys, want)
            if len(picks) == want:
                worst = max(float(c.total_usd[j]) for _, j in picks)
                open_locs = np.flatnonzero(float(cat.hourly_usd[pos]) * a_loc + loc_usd <= worst + 1e-12)
                if len(open_locs) == 0:
                    return c
                if len(open_locs) <= 12:
                    rest = np.flatnonzero(alive[pos:] & isin_codes(cat.loc_code[pos:], open_locs)) + pos
                    return _costs(request, cat, np.concatenate([hits, rest]), loc_usd, loc_hours, wait_hours)
        step *= 4


def _scan_time(request: Request, cat: Catalog, alive: np.ndarray, loc_usd: np.ndarray, loc_hours: np.ndarray,
               wait_hours: float, want: int) -> Costs:
    """Costs of the feasible rows that can hold the ``want`` best diverse options by finish time.

    Finish depends only on the location, so the picks come from the ``want`` earliest-finishing locations
    that have feasible rows (ties included); only their rows are costed."""
    per_loc = np.bincount(cat.loc_code, weights=alive, minlength=len(cat.locations)) > 0
    finish = np.round((wait_hours + loc_hours + request.duration_hours) * 3600.0)
    have = np.flatnonzero(per_loc)
    if len(have) > want:
        threshold = np.sort(finish[have])[want - 1]
        keep = have[finish[have] <= threshold]
        rows = np.flatnonzero(alive & isin_codes(cat.loc_code, keep))
    else:
        rows = np.flatnonzero(alive)
    return _costs(request, cat, rows, loc_usd, loc_hours, wait_hours)


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
    extra_feasible = [0]  # feasible rows not costed (beyond the price-ordered prefix _scan proved enough)
    for cat in parts:
        considered += len(cat)
        alive = np.ones(len(cat), dtype=bool)
        n_alive = len(cat)
        for fn in FILTERS.values():
            for reason, ok in fn(request, cat, ctx):
                np.logical_and(alive, ok, out=alive)
                left = int(np.count_nonzero(alive))
                if left < n_alive:
                    rejected[reason] = rejected.get(reason, 0) + n_alive - left
                n_alive = left
        loc_usd, loc_hours = _loc_costs(request, cat, egress)
        late_loc = deadline.late_locations(request, loc_hours, ctx)
        if n_alive and late_loc.any():
            late_rows = isin_codes(cat.loc_code, np.flatnonzero(late_loc))
            np.logical_and(alive, ~late_rows, out=alive)
            left = int(np.count_nonzero(alive))
            rejected[deadline.DeadlineMiss] = rejected.get(deadline.DeadlineMiss, 0) + n_alive - left
            n_alive = left
        if n_alive == 0:
            c = _costs(request, cat, np.zeros(0, dtype=np.int64), loc_usd, loc_hours, wait_hours)
        elif request.data and objective is not cost.keys:
            c = _scan_time(request, cat, alive, loc_usd, loc_hours, wait_hours, top + 1)
        else:
            # Without data every row finishes at the same time, so both objectives rank by cost.
            c = _scan(request, cat, alive, loc_usd, loc_hours, wait_hours, top + 1)
        extra_feasible[0] += n_alive - len(c.idx)
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
    return [_option(pools[p][0], pools[p][1], j) for p, j in _pick(request, pools, objective, want)]


def _pick(request: Request, pools: list[tuple[Catalog, Costs]], objective: object, want: int) -> list[tuple[int, int]]:
    """``(pool, row in pool costs)`` of the ``want`` picks of :func:`_rank`, in rank order."""
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
        if len(picked) < want and k < total:
            k *= 8  # not enough distinct regions among the candidates yet: widen before filling
            continue
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
        out.append((int(cc["pool"][r]), int(cc["j"][r])))
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
    loc_usd, loc_hours = _loc_costs(request, cat, egress)
    c = _costs(request, cat, np.arange(1), loc_usd, loc_hours, wait_hours)
    if not bool(deadline.ok(request, c, ctx)[0]):
        return Verdict.reject(deadline.DeadlineMiss)
    return Verdict.ok()
