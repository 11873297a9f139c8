"""Offer groups: the rows of a catalog that every filter but the price cap treats alike, built once.

Design choice: of the ~104k non-spot rows of the full catalog only ~19k differ in anything a filter reads
other than the price (provider, location, capacity, arch, accelerator, GPUs, vCPUs, memory, outlier flag,
GPU interconnect level, burstable family); the rest are the same shape in other zones or under other type
names. The engine
runs the filter plugins once over one representative row per group (its cheapest: the catalog is sorted by
price) and weights each group's verdict by its row count, so the rejection counts stay those of a pass over
every row. The price cap is the one row-level filter: rows are price-sorted, so it keeps a prefix of the
catalog, and the rows of a group under it are counted with one ``searchsorted`` over the group-sorted rows.

Contract for filter plugins: a filter's verdict on a row may depend only on the columns in
:data:`GROUP_COLUMNS`, the instance type's interconnect level (``topology``), its burstable family
(``burstable``) and, for ``price_cap`` only,
``hourly_usd``. A plugin that reads anything else must be added to the grouping key here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from policies.placement import burstable
from policies.placement.topology import type_levels
from pricing.catalog import Catalog

__all__ = ["OfferGroups", "offer_groups", "GROUP_COLUMNS"]

GROUP_COLUMNS = (
    "provider_code", "loc_code", "cap_code", "arch_code", "acc_code", "gpus", "vcpus", "memory_gib", "outlier",
)


@dataclass(frozen=True, slots=True)
class OfferGroups:
    """The groups of one catalog (see module docstring). Group ``g`` holds the rows ``gid == g``; groups are
    numbered in the order of their first (cheapest) row."""

    rep: Catalog  # one row per group: its first row (all grouped columns equal the group's rows')
    first_row: npt.NDArray[np.int64]  # per group: its first (cheapest) row in the catalog, ascending
    last_row: npt.NDArray[np.int64]  # per group: its last (dearest) row
    count: npt.NDArray[np.int64]  # per group: rows
    weight: npt.NDArray[np.int32]  # ``count`` as int32, for weighted sums with bool masks
    gid: npt.NDArray[np.intp]  # per catalog row: its group
    start: npt.NDArray[np.int64]  # per group: offset of its rows in ``sorted_key``
    sorted_key: npt.NDArray[np.int64]  # ``gid * n + row`` of every row, ascending (rows grouped, in order)

    def rows_of(self, groups: npt.NDArray[np.int64], counts: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
        """The first ``counts[i]`` rows of each group ``groups[i]``, as ascending catalog rows."""
        counts = counts.astype(np.int64)
        total = int(counts.sum())
        ends = np.cumsum(counts)
        pos = np.arange(total, dtype=np.int64) + np.repeat(self.start[groups] - (ends - counts), counts)
        return np.sort(self.sorted_key[pos] % len(self.gid))

    def rows_before(self, groups: npt.NDArray[np.int64], k: int) -> npt.NDArray[np.int64]:
        """Per group in ``groups``: how many of its rows lie in the catalog prefix ``[0, k)``. Only the
        groups straddling ``k`` need a search; the others have all or none of their rows there."""
        first, last = self.first_row[groups], self.last_row[groups]
        out = np.where(last < k, self.count[groups], 0)
        mid = np.flatnonzero((first < k) & (last >= k))
        if len(mid):
            gm = groups[mid]
            out[mid] = np.searchsorted(self.sorted_key, gm * len(self.gid) + k) - self.start[gm]
        return out


def offer_groups(cat: Catalog) -> OfferGroups:
    """The groups of ``cat``, built once per catalog object (~50 ms per shard of the full catalog)."""
    return cat.derived("placement-groups", lambda: _build(cat))  # type: ignore[no-any-return]


def _build(cat: Catalog) -> OfferGroups:
    n = len(cat)
    code = np.zeros(n, dtype=np.int64)
    cols = [getattr(cat, k) for k in GROUP_COLUMNS]
    cols.append(type_levels(tuple(cat.type_names)).take(cat.type_code) if len(cat.type_names) else np.zeros(n))
    cols.append(burstable.row_mask(cat))
    for col in cols:
        # Re-factorise after every column: codes stay below n, so the product never overflows.
        _, inv = np.unique(col, return_inverse=True)
        code = code * (int(inv.max(initial=0)) + 1) + inv.reshape(-1)
        _, code = np.unique(code, return_inverse=True)
        code = code.reshape(-1).astype(np.int64)
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # groups numbered by their first row
    rank = np.empty(len(order), dtype=np.intp)
    rank[order] = np.arange(len(order))
    gid = rank[inv.reshape(-1)].astype(np.intp)
    first_row = first[order].astype(np.int64)
    count = np.bincount(gid, minlength=len(order)).astype(np.int64)
    by_group = np.argsort(gid, kind="stable")
    sorted_key = gid[by_group].astype(np.int64) * n + by_group
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    last_row = by_group[start + count - 1].astype(np.int64)
    for a in (first_row, last_row, count, gid, start, sorted_key):
        a.setflags(write=False)
    return OfferGroups(rep=cat.subset(first_row), first_row=first_row, last_row=last_row, count=count,
                       weight=count.astype(np.int32), gid=gid, start=start, sorted_key=sorted_key)
