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
from typing import Any, NamedTuple

import numpy as np

from broker.errors import SpecError
from broker.model import Capacity, Offer, PlacementOption, PlacementResult, Provenance, Request, SpotPolicy
from policies.placement import (
    accelerator,
    allowlist,
    arch,
    burstable,
    cost,
    deadline,
    finish_time,
    fit,
    outlier,
    price_cap,
    spot,
    topology,
)
from policies.placement.base import Context, Costs, FilterFn, Verdict, isin_codes
from policies.placement.explain import explain
from policies.placement.groups import offer_groups
from pricing.catalog import ARCHS, CAPACITIES, Catalog
from pricing.egress import EgressModel
from pricing.geo import continent_of
from pricing.interruption import InterruptionModel, load_interruptions

__all__ = [
    "place", "check_offer", "best_per_location", "best_totals_per_location", "price_offer", "FILTERS", "SCORES",
    "REASONS",
]

# Filter plugins in the order they are applied (a row is counted under the first reason that rejects it).
FILTERS: dict[str, FilterFn] = {
    allowlist.NAME: allowlist.checks,
    spot.NAME: spot.checks,
    arch.NAME: arch.checks,
    accelerator.NAME: accelerator.checks,
    fit.NAME: fit.checks,
    burstable.NAME: burstable.checks,
    topology.NAME: topology.checks,
    outlier.NAME: outlier.checks,
    price_cap.NAME: price_cap.checks,
}
SCORES = {cost.NAME: cost.keys, finish_time.NAME: finish_time.keys}
REASONS: tuple[str, ...] = (
    *allowlist.REASONS, *spot.REASONS, *arch.REASONS, *accelerator.REASONS, *fit.REASONS, *burstable.REASONS,
    *topology.REASONS,
    *outlier.REASONS,
    *price_cap.REASONS, *deadline.REASONS,
)
_CANDIDATES = 256  # rows ranked per round; widened until enough diverse alternatives are found
_PREFIX_GROUPS = 256  # live groups looked at first for the first locations of a request without data
_SCAN_STEP = 1024  # first price-ordered window of _location_firsts (tests shrink it to exercise the bound)


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


class _LocCosts(NamedTuple):
    """Per catalog location: USD of moving every data input there, the hours it takes, and the spot
    interruption factor (``interruption_usd / compute_usd`` of a spot row there; 0 without spot)."""

    usd: np.ndarray
    hours: np.ndarray
    risk: np.ndarray


def _loc_costs(request: Request, cat: Catalog, egress: EgressModel, risk: InterruptionModel) -> _LocCosts:
    usd = np.zeros(len(cat.locations))
    hours = np.zeros(len(cat.locations))
    for d in request.data:
        u, h = egress.to_locations(d.location, d.size_gib, cat.locations)
        usd += u
        hours += h
    if request.spot == SpotPolicy.NEVER:
        factor = np.zeros(len(cat.locations))
    else:
        factor = risk.factor(request.nodes, request.duration_hours + hours, risk.location_rates(cat.locations))
    return _LocCosts(usd, hours, factor)


_SPOT_CODE = CAPACITIES.index(Capacity.SPOT)
_CAPACITY_VALUES = tuple(c.value for c in CAPACITIES)


def _costs(request: Request, cat: Catalog, idx: np.ndarray, lc: _LocCosts, wait_hours: float) -> Costs:
    loc = cat.loc_code[idx]
    hourly = cat.hourly_usd[idx]
    transfer = lc.hours[loc]
    egress_usd = lc.usd[loc]
    compute = hourly * request.nodes * (request.duration_hours + transfer)
    interruption = compute * np.where(cat.cap_code[idx] == _SPOT_CODE, lc.risk[loc], 0.0)
    return Costs(
        idx=idx, hourly_usd=hourly, compute_usd=compute, egress_usd=egress_usd, transfer_hours=transfer,
        total_usd=compute + egress_usd + interruption, finish_hours=wait_hours + transfer + request.duration_hours,
        interruption_usd=interruption,
    )


def _spot_risk(cat: Catalog, lc: _LocCosts) -> np.ndarray | None:
    """The per-location factor by which ``cat``'s rows' compute grows (all its rows spot), ``None`` when no row
    is at risk, or an empty array when the catalog mixes spot and other rows at risk (no per-location bound)."""
    if not lc.risk.any() or not len(cat):
        return None
    spot = cat.cap_code == _SPOT_CODE
    if spot.all():
        return lc.risk
    return None if not spot.any() else np.zeros(0)


def _location_firsts(cat: Catalog, alive: np.ndarray, want: int, a_loc: np.ndarray, b_loc: np.ndarray,
                     *, exhaustive: bool, uniform: bool = False) -> np.ndarray | None:
    """Rows that provably hold the ``want`` best diverse picks: the first feasible row of each location
    found, or ``None`` when fewer than ``want`` locations have feasible rows (then more rows per location
    are needed to fill the alternatives and the caller costs every feasible row).

    Design choice: the catalog is sorted by hourly price and a row's total is ``hourly x A[loc] + B[loc]``
    (``A`` = node-hours incl. transfer, ``B`` = egress), and its finish depends only on its location; so a
    location's best row is its first feasible row. Windows of growing size are scanned in price order,
    recording each location's first row. For ``cost`` the scan stops once ``want`` locations are found and
    every location not yet seen must cost at least ``hourly[stop] x A + B``, more than the ``want``-th best
    found; ``exhaustive`` (the ``time`` objective) scans to the end. At most one row per location (~150) is
    then costed and ranked, and the answer is exact."""
    n = len(alive)
    first = np.full(len(cat.locations), -1, dtype=np.int64)
    uniform = uniform or len(a_loc) == 0 or bool(np.ptp(a_loc) == 0.0 and np.ptp(b_loc) == 0.0)
    pos, step = int(alive.argmax()), _SCAN_STEP  # argmax of a bool array stops at the first feasible row
    while pos < n:
        stop = n if exhaustive else min(n, pos + step)
        hits = np.flatnonzero(alive[pos:stop]) + pos
        pos, step = stop, step * 4
        if len(hits):
            locs = cat.loc_code[hits]
            fresh = first[locs] < 0
            if fresh.any():
                h, lo = hits[fresh], locs[fresh]
                first[lo[::-1]] = h[::-1]  # the last write wins: reversed, that is each location's first row
        if exhaustive or pos >= n:
            continue
        found = np.flatnonzero(first >= 0)
        if len(found) < want:
            continue
        if uniform:  # every location prices alike: price order is rank order (ties by row)
            return np.sort(first[found])[:want]
        totals = cat.hourly_usd[first[found]] * a_loc[found] + b_loc[found]
        worst = float(np.partition(totals, want - 1)[want - 1])
        unseen = first < 0
        if not unseen.any() or float((cat.hourly_usd[pos] * a_loc[unseen] + b_loc[unseen]).min()) > worst:
            break
    found = np.flatnonzero(first >= 0)
    if len(found) < want:
        return None
    return np.sort(first[found])


_NO_ROWS = np.zeros(0, dtype=np.int64)


def _filter_rows(request: Request, cat: Catalog, ctx: Context, rejected: dict[str, int], want: int,
                 objective: object, lc: _LocCosts, *, all_locations: bool = False) -> tuple[int, np.ndarray]:
    """Apply every filter (deadline included) to every row of ``cat``, adding to ``rejected``; return the
    number of feasible rows and the rows to cost (see :func:`_location_firsts`; ``all_locations``: at least
    the first feasible row of every location)."""
    alive: np.ndarray | None = None
    n_alive = len(cat)
    for fn in FILTERS.values():
        if n_alive == 0:
            break
        for reason, ok in fn(request, cat, ctx):
            if alive is None:
                alive = np.array(ok, dtype=bool)  # a copy: plugins may return cached arrays
            else:
                np.logical_and(alive, ok, out=alive)
            left = int(np.count_nonzero(alive))
            if left < n_alive:
                rejected[reason] = rejected.get(reason, 0) + n_alive - left
            n_alive = left
            if n_alive == 0:
                break
    if alive is None:
        alive = np.ones(len(cat), dtype=bool)
    late_loc = deadline.late_locations(request, lc.hours, ctx)
    if n_alive and late_loc.any():
        late_rows = isin_codes(cat.loc_code, np.flatnonzero(late_loc))
        np.logical_and(alive, ~late_rows, out=alive)
        left = int(np.count_nonzero(alive))
        rejected[deadline.DeadlineMiss] = rejected.get(deadline.DeadlineMiss, 0) + n_alive - left
        n_alive = left
    if n_alive == 0:
        return 0, _NO_ROWS
    risk = _spot_risk(cat, lc)
    if risk is not None and not len(risk):  # spot and other rows at risk mixed: cost every feasible row
        return n_alive, np.flatnonzero(alive)
    a_loc = request.nodes * (request.duration_hours + lc.hours)
    if risk is not None:
        a_loc = a_loc * (1.0 + risk)
    rows = _location_firsts(cat, alive, want, a_loc, lc.usd,
                            exhaustive=all_locations or (bool(request.data) and objective is not cost.keys),
                            uniform=not request.data and (risk is None or bool(np.ptp(risk) == 0.0)))
    return n_alive, np.flatnonzero(alive) if rows is None else rows


def _weighted_count(mask: np.ndarray, weight: np.ndarray) -> int:
    """``sum(weight[mask])`` for an int32 ``weight`` (einsum: no temporary, no BLAS threads)."""
    return int(np.einsum("i,i->", mask.view(np.uint8), weight))


def _filter_grouped(request: Request, cat: Catalog, ctx: Context, rejected: dict[str, int], want: int,
                    objective: object, lc: _LocCosts, *, all_locations: bool = False) -> tuple[int, np.ndarray]:
    """:func:`_filter_rows` computed per offer group (see :mod:`policies.placement.groups`): the same counts
    and a superset of its rows to cost: every location's first feasible row, or every feasible row when
    fewer than ``want`` locations have one (the superset ranks the same, since a location's first feasible
    row is its best)."""
    g = offer_groups(cat)
    rep = g.rep
    alive: np.ndarray | None = None
    weight = g.weight  # rows per group still counted (the price cap lowers it)
    n_alive = len(cat)
    cap_k = len(cat)  # rows [0, cap_k) pass the price cap
    n_groups = len(g.count)  # groups still alive
    for name, fn in FILTERS.items():
        if n_alive == 0:
            break
        if name == price_cap.NAME:
            lim = price_cap.limit(request)
            if lim is None:
                continue
            cap_k = int(np.searchsorted(cat.hourly_usd, lim, side="right"))
            if cap_k < len(cat):
                live = np.flatnonzero(alive) if alive is not None else np.arange(len(g.count))
                under = g.rows_before(live, cap_k)
                weight = np.zeros(len(g.count), dtype=np.int32)
                weight[live] = under
                if alive is None:
                    alive = np.ones(len(g.count), dtype=bool)
                alive[live] = under > 0
                n_groups = int(np.count_nonzero(alive))
                left = int(under.sum())
                if left < n_alive:
                    rejected[price_cap.OverPriceCap] = rejected.get(price_cap.OverPriceCap, 0) + n_alive - left
                n_alive = left
            continue
        for reason, ok in fn(request, rep, ctx):
            if alive is None:
                alive = np.array(ok, dtype=bool)
            else:
                np.logical_and(alive, ok, out=alive)
            groups_left = int(np.count_nonzero(alive))  # cheap: skips the weighted count when nothing went
            left = n_alive if groups_left == n_groups else _weighted_count(alive, weight) if groups_left else 0
            n_groups = groups_left
            if left < n_alive:
                rejected[reason] = rejected.get(reason, 0) + n_alive - left
            n_alive = left
            if n_alive == 0:
                break
    if alive is None:
        alive = np.ones(len(g.count), dtype=bool)
    late_loc = deadline.late_locations(request, lc.hours, ctx)
    if n_alive and late_loc.any():
        np.logical_and(alive, ~late_loc[rep.loc_code], out=alive)
        left = _weighted_count(alive, weight)
        rejected[deadline.DeadlineMiss] = rejected.get(deadline.DeadlineMiss, 0) + n_alive - left
        n_alive = left
    if n_alive == 0:
        return 0, _NO_ROWS
    # Groups are numbered in ascending first row (with a price cap, a live group's first row is under it);
    # a location's first feasible row is the first row of its first live group.
    n_locs, stop = len(cat.locations), len(alive)
    risk = _spot_risk(cat, lc)  # a shard is all spot or none: one factor per location
    uniform = not request.data and (risk is None or bool(np.ptp(risk) == 0.0))
    if uniform and not all_locations:
        # Without data every location prices alike: price order is rank order, so the first ``want``
        # locations' rows are the candidates (as in _location_firsts); a prefix of the groups usually has them.
        stop = min(stop, _PREFIX_GROUPS)
    while True:
        live = np.flatnonzero(alive[:stop])
        first = np.full(n_locs, -1, dtype=np.int64)
        first[rep.loc_code[live[::-1]]] = g.first_row[live[::-1]]  # the last write wins: each location's first
        found = first[first >= 0]
        if len(found) >= want:
            return n_alive, np.sort(found)[:want] if uniform and not all_locations else np.sort(found)
        if stop >= len(alive):
            break
        stop = min(len(alive), stop * 8)
    return n_alive, g.rows_of(live, weight[live])


def _options(cat: Catalog, c: Costs, js: list[int]) -> list[PlacementOption]:
    """The options of rows ``js`` of ``c`` (one gather per column, then plain Python values)."""
    ja = np.asarray(js, dtype=np.int64)
    rows = c.idx[ja]
    locs = cat.loc_code[rows].tolist()
    zones = cat.zone_code[rows].tolist()
    types = cat.type_code[rows].tolist()
    caps = cat.cap_code[rows].tolist()
    accs = cat.acc_code[rows].tolist()
    arches = cat.arch_code[rows].tolist()
    risk_usd = c.interruption_usd if c.interruption_usd is not None else np.zeros(len(c.idx))
    cols = [cat.vcpus[rows].tolist(), cat.memory_gib[rows].tolist(), cat.gpus[rows].tolist(),
            c.hourly_usd[ja].tolist(), c.compute_usd[ja].tolist(), c.egress_usd[ja].tolist(),
            c.transfer_hours[ja].tolist(), c.total_usd[ja].tolist(), c.finish_hours[ja].tolist(),
            risk_usd[ja].tolist()]
    out = []
    locations, zone_names, type_names, accelerators = cat.locations, cat.zones, cat.type_names, cat.accelerators
    for n, values in enumerate(zip(*cols, strict=True)):
        vcpus, mem, gpus, hourly, compute, egress_usd, transfer, total, finish, risk = values
        loc = locations[locs[n]]
        out.append(PlacementOption(
            provider=loc.provider, region=loc.region, zone=zone_names[zones[n]] or None,
            instance_type=type_names[types[n]], capacity=_CAPACITY_VALUES[caps[n]], vcpus=vcpus,
            memory_gib=mem, gpus=gpus, accelerator=accelerators[accs[n]] or None, hourly_usd=hourly,
            compute_usd=compute, egress_usd=egress_usd, transfer_hours=transfer, total_usd=total,
            site=loc.site.value, finish_hours=finish, arch=ARCHS[int(arches[n])], interruption_usd=risk,
        ))
    return out


def _prepare(request: Request, catalog: Catalog, egress: EgressModel,
             extra_offers: Sequence[Offer]) -> list[Catalog]:
    """The catalog's capacity shards plus the extra offers' catalog, the request's data locations checked."""
    # Design choice: the catalog is split once into a non-spot and a spot shard (sharing its tables); the
    # filter loop stops a shard as soon as no row is left, so the spot plugin empties the shard a request
    # cannot use after two cheap checks, and rejection counts stay those of one pass over every offer.
    parts = [*catalog.capacity_shards()] + ([_extra_catalog(tuple(extra_offers))] if extra_offers else [])
    _validate(request, parts, egress)
    return parts


def best_per_location(
    request: Request,
    catalog: Catalog,
    egress: EgressModel,
    *,
    now: datetime | None = None,
    extra_offers: Sequence[Offer] = (),
    wait_hours: float = 0.0,
    risk: InterruptionModel | None = None,
) -> dict[str, PlacementOption]:
    """``{provider:region: its best feasible option}`` over every location where ``request`` is feasible (every
    filter and the deadline applied, as :func:`place`), ranked by the request's objective. A location's best row
    is its first feasible row in price order (see :func:`_location_firsts`), so this costs one row per location."""
    winners, costed = _location_winners(request, catalog, egress, now=now, extra_offers=extra_offers,
                                        wait_hours=wait_hours, risk=risk)
    built: dict[tuple[int, int], PlacementOption] = {}
    for q, (cat, c) in enumerate(costed):
        js = sorted({j for p, j in winners.values() if p == q})
        if js:
            built.update(zip(((q, j) for j in js), _options(cat, c, js), strict=True))
    return {loc: built[pj] for loc, pj in winners.items()}


def best_totals_per_location(
    request: Request,
    catalog: Catalog,
    egress: EgressModel,
    *,
    now: datetime | None = None,
    extra_offers: Sequence[Offer] = (),
    wait_hours: float = 0.0,
    risk: InterruptionModel | None = None,
) -> dict[str, tuple[float, str]]:
    """``{provider:region: (total_usd, site)}`` of :func:`best_per_location`'s options, without building them
    (what the savings baselines read, once per recorded decision)."""
    winners, costed = _location_winners(request, catalog, egress, now=now, extra_offers=extra_offers,
                                        wait_hours=wait_hours, risk=risk)
    out: dict[str, tuple[float, str]] = {}
    for loc, (q, j) in winners.items():
        cat, c = costed[q]
        out[loc] = (float(c.total_usd[j]), cat.locations[int(cat.loc_code[c.idx[j]])].site.value)
    return out


def _location_winners(
    request: Request,
    catalog: Catalog,
    egress: EgressModel,
    *,
    now: datetime | None,
    extra_offers: Sequence[Offer],
    wait_hours: float,
    risk: InterruptionModel | None,
) -> tuple[dict[str, tuple[int, int]], list[tuple[Catalog, Costs]]]:
    """``({provider:region: (part, row of its costs)}, [(part catalog, its costs)])`` of each location's best
    feasible row, locations sorted (see :func:`best_per_location`). Ranks compare as tuples of the objective's
    keys; a later row (or part) replaces the one seen only when strictly better."""
    ctx = Context(now=now or datetime.now(UTC), wait_hours=wait_hours)
    parts = _prepare(request, catalog, egress, extra_offers)
    objective = SCORES.get(str(request.objective), cost.keys)
    out: dict[str, tuple[tuple[float, ...], tuple[int, int]]] = {}  # location -> (rank, (part, row))
    loc_costs: dict[int, _LocCosts] = {}
    model = risk or load_interruptions()
    costed: list[tuple[Catalog, Costs]] = []
    for p, cat in enumerate(parts):
        if not len(cat):
            continue
        lc = _shared_loc_costs(loc_costs, request, cat, egress, model)
        none: dict[str, int] = {}  # rejection counts are not needed here
        fn = _filter_grouped if p < 2 else _filter_rows
        _, rows = fn(request, cat, ctx, none, 1, objective, lc, all_locations=True)
        if not len(rows):
            continue
        c = _costs(request, cat, rows, lc, wait_hours)
        ks = [k.tolist() for k in objective(request, c)]  # type: ignore[operator]
        names = _location_names(cat.locations)
        for j, (code, rank) in enumerate(zip(cat.loc_code[c.idx].tolist(), zip(*ks, strict=True), strict=True)):
            loc = names[code]
            seen = out.get(loc)
            if seen is None or rank < seen[0]:
                out[loc] = (rank, (len(costed), j))
        costed.append((cat, c))
    return {loc: pj for loc, (_, pj) in sorted(out.items())}, costed


_NAMES: dict[int, tuple[Sequence[Any], list[str]]] = {}


def _location_names(locations: Sequence[Any]) -> list[str]:
    """``provider:region`` of each location of a catalog's table, kept per table (the table object is held,
    so its id is not reused while the entry lives)."""
    hit = _NAMES.get(id(locations))
    if hit is None or hit[0] is not locations or len(hit[1]) != len(locations):
        if len(_NAMES) > 32:
            _NAMES.clear()
        hit = _NAMES[id(locations)] = (locations, [f"{loc.provider}:{loc.region}" for loc in locations])
    return hit[1]


def _shared_loc_costs(memo: dict[int, _LocCosts], request: Request, cat: Catalog, egress: EgressModel,
                     model: InterruptionModel) -> _LocCosts:
    """:func:`_loc_costs` once per location table (the capacity shards share their catalog's)."""
    key = id(cat.locations)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _loc_costs(request, cat, egress, model)
    return hit


def price_offer(request: Request, offer: Offer, egress: EgressModel, *, wait_hours: float = 0.0,
                risk: InterruptionModel | None = None) -> PlacementOption:
    """``offer`` costed for ``request`` exactly as :func:`place` costs a row (compute over duration and
    transfer, egress of every input to its location, spot interruption risk), whether or not the filters
    would take it."""
    cat = _extra_catalog((offer,))
    _validate(request, [cat], egress)
    lc = _loc_costs(request, cat, egress, risk or load_interruptions())
    return _options(cat, _costs(request, cat, np.arange(1), lc, wait_hours), [0])[0]


def place(
    request: Request,
    catalog: Catalog,
    egress: EgressModel,
    *,
    top: int = 5,
    now: datetime | None = None,
    extra_offers: Sequence[Offer] = (),
    wait_hours: float = 0.0,
    baselines: bool = False,
    risk: InterruptionModel | None = None,
) -> PlacementResult:
    """The best placement of ``request`` over ``catalog`` (plus ``extra_offers``: on-prem/edge capacity
    available now) and up to ``top`` ranked, diverse alternatives.

    ``now`` (UTC, default the current time) and ``wait_hours`` (predicted queue wait) judge the deadline.
    ``placement`` is ``None`` when nothing is feasible; ``rejected`` then says why, per reason constant.
    Raises :class:`SpecError` (field ``spec.data[i].location``) for a data location that neither the
    catalog, the inventory nor the region tables know. Pure: reads its arguments only. ``baselines=True``
    also fills ``result.baselines`` (what the report's savings baselines need; a few more placements).
    """
    now = now or datetime.now(UTC)
    ctx = Context(now=now, wait_hours=wait_hours)
    parts = _prepare(request, catalog, egress, extra_offers)
    objective = SCORES.get(str(request.objective), cost.keys)
    rejected: dict[str, int] = {}
    considered = 0
    pools: list[tuple[Catalog, Costs]] = []
    extra_feasible = [0]  # feasible rows not costed (_location_firsts proved they cannot win)
    want = top + 1
    loc_costs: dict[int, _LocCosts] = {}  # the shards share one location table
    model = risk or load_interruptions()
    for p, cat in enumerate(parts):
        considered += len(cat)
        lc = _shared_loc_costs(loc_costs, request, cat, egress, model)
        args = (request, cat, ctx, rejected, want, objective, lc)
        # Shards of the catalog are filtered per offer group; extra offers (a few on-prem/edge rows) per row.
        n_alive, rows = _filter_grouped(*args) if p < 2 and len(cat) else _filter_rows(*args)
        c = _costs(request, cat, rows, lc, wait_hours)
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
    if baselines:
        from dataclasses import replace

        from policies.placement.baselines import decision_baselines

        res = replace(res, baselines=decision_baselines(request, catalog, egress, res, now=now,
                                                        extra_offers=extra_offers, wait_hours=wait_hours,
                                                        risk=model))
    return _with_explanation(res)


def _with_explanation(res: PlacementResult) -> PlacementResult:
    from dataclasses import replace

    return replace(res, explanation=explain(res))


def _rank(request: Request, pools: list[tuple[Catalog, Costs]], objective: object, want: int) -> list[PlacementOption]:
    """``want`` options: the best, then diverse alternatives in rank order (see module docstring)."""
    picks = _pick(request, pools, objective, want)
    built: dict[tuple[int, int], PlacementOption] = {}
    for p in dict.fromkeys(p for p, _ in picks):
        js = [j for q, j in picks if q == p]
        built.update(zip(((p, j) for j in js), _options(pools[p][0], pools[p][1], js), strict=True))
    return [built[pj] for pj in picks]


def _pick(request: Request, pools: list[tuple[Catalog, Costs]], objective: object, want: int) -> list[tuple[int, int]]:
    """``(pool, row in pool costs)`` of the ``want`` picks of :func:`_rank`, in rank order: sorted by the
    objective's keys (ties by pool, then catalog row), first the first row of each distinct location, then,
    when fewer locations exist, the first row of each further (location, type, capacity)."""
    k = _CANDIDATES
    total = sum(len(c.idx) for _, c in pools)
    while True:
        keys: list[list[np.ndarray]] = []
        pool_l, j_l, row_l, reg_l = [], [], [], []
        ltc_l: list[tuple[Catalog, np.ndarray, np.ndarray]] = []
        # Pools cut from one catalog share its tables, so their location codes compare directly.
        group_of: dict[int, int] = {}
        for p, (cat, c) in enumerate(pools):
            g = group_of.setdefault(id(cat.locations), len(group_of))
            ks = objective(request, c)  # type: ignore[operator]
            n = len(c.idx)
            if n <= k:  # every row is a candidate: no gathers
                take, rows = np.arange(n), c.idx
                keys.append(list(ks))
            else:
                take = _top_k(ks, c.idx, k)
                rows = c.idx[take]
                keys.append([kk[take] for kk in ks])
            pool_l.append(np.full(len(take), p))
            j_l.append(take)
            row_l.append(rows)
            reg = cat.loc_code[rows].astype(np.int64) + g * (1 << 40)
            reg_l.append(reg)
            ltc_l.append((cat, reg, rows))
        if len(pools) == 1:
            cat_keys, pool_a, j_a, row_a, reg_a = keys[0], pool_l[0], j_l[0], row_l[0], reg_l[0]
        else:
            cat_keys = [np.concatenate([kl[i] for kl in keys]) for i in range(len(keys[0]))]
            pool_a, j_a, row_a = np.concatenate(pool_l), np.concatenate(j_l), np.concatenate(row_l)
            reg_a = np.concatenate(reg_l)
        order = np.lexsort((row_a, pool_a, *reversed(cat_keys))).tolist()
        regs = reg_a.tolist()
        picked: list[int] = []
        seen: set[int] = set()
        for r in order:
            if regs[r] not in seen:
                seen.add(regs[r])
                picked.append(r)
                if len(picked) == want:
                    break
        if len(picked) < want and k < total:
            k *= 8  # not enough distinct locations among the candidates yet: widen before filling
            continue
        if len(picked) < want:
            ltcs = np.concatenate([(reg * (len(cat.type_names) + 1) + cat.type_code[rows]) * 8 + cat.cap_code[rows]
                                   for cat, reg, rows in ltc_l]).tolist()
            chosen = set(picked)
            seen_ltc = {ltcs[r] for r in picked}
            for r in order:
                if r not in chosen and ltcs[r] not in seen_ltc:
                    seen_ltc.add(ltcs[r])
                    chosen.add(r)
                    if len(chosen) == want:
                        break
            rank = {r: i for i, r in enumerate(order)}
            picked = sorted(chosen, key=rank.__getitem__)
        pools_of, js_of = pool_a.tolist(), j_a.tolist()
        return [(pools_of[r], js_of[r]) for r in picked]


def _top_k(ks: Sequence[np.ndarray], rows: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` first rows in the full rank order (every key, then catalog row), unordered.

    Design choice: a partition on the first key alone cuts ties at the boundary arbitrarily, so with the
    ``time`` objective (many rows finish at the same second) a cheaper row could be dropped before the cost
    tie-break. Rows strictly before the boundary value are kept; of the rows tied at it, only as many as
    needed are taken, in the order of the remaining keys and the row (what the final sort would do)."""
    first = ks[0]
    kth = np.partition(first, k - 1)[k - 1]
    less = np.flatnonzero(first < kth)
    tied = np.flatnonzero(first == kth)
    need = k - len(less)
    if len(tied) > need:
        order = np.lexsort((rows[tied], *(kk[tied] for kk in reversed(ks[1:]))))
        tied = tied[order[:need]]
    return np.concatenate([less, tied])


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
    lc = _loc_costs(request, cat, egress, load_interruptions())
    c = _costs(request, cat, np.arange(1), lc, wait_hours)
    if not bool(deadline.ok(request, c, ctx)[0]):
        return Verdict.reject(deadline.DeadlineMiss)
    return Verdict.ok()
