"""Gang placement: a job of ``nodes: N`` gets all N nodes or none.

Capacity is given as :class:`Slot` values: ``count`` free nodes of one instance type at one
place (provider, region, zone or on-prem/edge site). :func:`place_gang`

* places all N nodes or returns the reason it cannot (``GangUnschedulable: ...``), never a part;
* with ``same_zone`` keeps every node in one zone (one site for on-prem and edge), the cheapest such;
* with ``interconnect`` (``nvlink`` or ``nvswitch``) prefers instance types with that interconnect
  (NVSwitch also provides NVLink); with ``require_interconnect`` it insists;
* otherwise spreads (``spread``: one node per zone in turn, cheapest zones first, for failure isolation)
  or packs (``pack``: fill the cheapest zone, then the next, for locality and fewer zones).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["REASON", "PACK", "SPREAD", "Slot", "GangPlacement", "place_gang", "interconnect_satisfies"]

REASON = "GangUnschedulable"
PACK = "pack"
SPREAD = "spread"


@dataclass(frozen=True, slots=True)
class Slot:
    """``count`` free nodes of ``instance_type`` at ``provider:region`` in ``zone`` (``None``: the region
    or site is the zone), ``hourly_usd`` per node."""

    provider: str
    region: str
    instance_type: str
    hourly_usd: float
    count: int
    zone: str | None = None
    interconnect: str | None = None
    gpus: int = 0

    @property
    def zone_key(self) -> str:
        return f"{self.provider}:{self.region}:{self.zone or '-'}"


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """All nodes of a gang: ``(slot, nodes)`` pairs, their total ``hourly_usd`` and a readable
    ``explanation``."""

    assignments: tuple[tuple[Slot, int], ...]
    hourly_usd: float
    explanation: str

    @property
    def nodes(self) -> int:
        return sum(n for _, n in self.assignments)

    @property
    def zones(self) -> tuple[str, ...]:
        return tuple(sorted({s.zone_key for s, _ in self.assignments}))


def interconnect_satisfies(have: str | None, want: str) -> bool:
    """``nvswitch`` satisfies a wish for ``nvlink``; otherwise names must match."""
    if have is None:
        return False
    have, want = have.lower(), want.lower()
    return have == want or (want == "nvlink" and have == "nvswitch")


def _fill(nodes: int, slots: Sequence[Slot]) -> list[tuple[Slot, int]] | None:
    out: list[tuple[Slot, int]] = []
    left = nodes
    for s in sorted(slots, key=lambda s: (s.hourly_usd, s.instance_type, s.zone_key)):
        if left == 0:
            break
        take = min(left, s.count)
        if take > 0:
            out.append((s, take))
            left -= take
    return out if left == 0 else None


def _cost(assign: Sequence[tuple[Slot, int]]) -> float:
    return sum(s.hourly_usd * n for s, n in assign)


def _by_zone(slots: Sequence[Slot]) -> dict[str, list[Slot]]:
    zones: dict[str, list[Slot]] = defaultdict(list)
    for s in slots:
        zones[s.zone_key].append(s)
    return zones


def _spread(nodes: int, slots: Sequence[Slot]) -> list[tuple[Slot, int]] | None:
    zones = _by_zone(slots)
    queues = {z: sorted(ss, key=lambda s: (s.hourly_usd, s.instance_type)) for z, ss in zones.items()}
    left = {id(s): s.count for s in slots}
    order = sorted(zones, key=lambda z: (min(s.hourly_usd for s in zones[z]), z))
    taken: dict[int, int] = defaultdict(int)
    placed = 0
    while placed < nodes:
        progress = False
        for z in order:
            if placed == nodes:
                break
            slot = next((s for s in queues[z] if left[id(s)] > 0), None)
            if slot is None:
                continue
            left[id(slot)] -= 1
            taken[id(slot)] += 1
            placed += 1
            progress = True
        if not progress:
            return None
    return [(s, taken[id(s)]) for s in slots if taken[id(s)] > 0]


def _place(nodes: int, slots: Sequence[Slot], same_zone: bool, policy: str) -> list[tuple[Slot, int]] | None:
    if same_zone:
        best: list[tuple[Slot, int]] | None = None
        for z in sorted(_by_zone(slots)):
            assign = _fill(nodes, _by_zone(slots)[z])
            if assign is not None and (best is None or _cost(assign) < _cost(best) - 1e-12):
                best = assign
        return best
    if policy == SPREAD:
        return _spread(nodes, slots)
    zones = _by_zone(slots)
    # pack: one zone if any holds the gang (cheapest), else fill zones cheapest-first
    single = _place(nodes, slots, True, PACK)
    if single is not None:
        return single
    ordered = sorted(zones, key=lambda z: (min(s.hourly_usd for s in zones[z]), z))
    return _fill_zones(nodes, [zones[z] for z in ordered])


def _fill_zones(nodes: int, zone_slots: Sequence[Sequence[Slot]]) -> list[tuple[Slot, int]] | None:
    out: list[tuple[Slot, int]] = []
    left = nodes
    for ss in zone_slots:
        part = _fill(min(left, sum(s.count for s in ss)), ss) or []
        out.extend(part)
        left -= sum(n for _, n in part)
        if left == 0:
            return out
    return None


def place_gang(
    nodes: int,
    slots: Sequence[Slot],
    *,
    same_zone: bool = False,
    interconnect: str | None = None,
    require_interconnect: bool = False,
    policy: str = PACK,
) -> GangPlacement | str:
    """All ``nodes`` on ``slots``, or the reason string (``GangUnschedulable: ...``) when impossible."""
    if nodes < 1:
        raise ValueError(f"a gang needs at least 1 node, got {nodes}")
    if policy not in (PACK, SPREAD):
        raise ValueError(f"unknown gang policy {policy!r}. To fix: use pack or spread")
    usable = [s for s in slots if s.count > 0]
    notes = []
    if interconnect:
        linked = [s for s in usable if interconnect_satisfies(s.interconnect, interconnect)]
        assign = _place(nodes, linked, same_zone, policy)
        if assign is not None:
            return _result(assign, f"all {nodes} nodes on {interconnect} instance types")
        if require_interconnect:
            return (
                f"{REASON}: needs {nodes} nodes with {interconnect} interconnect"
                f"{' in one zone' if same_zone else ''}; only {sum(s.count for s in linked)} such nodes are free"
            )
        notes.append(f"no {nodes} {interconnect} nodes free, so without it")
    assign = _place(nodes, usable, same_zone, policy)
    if assign is None:
        total = sum(s.count for s in usable)
        biggest = max((sum(s.count for s in ss) for ss in _by_zone(usable).values()), default=0)
        if same_zone and total >= nodes:
            return f"{REASON}: needs {nodes} nodes in one zone; the largest zone has {biggest} free ({total} in all)"
        return f"{REASON}: needs {nodes} nodes; only {total} free. To fix: lower spec.nodes or wait"
    return _result(assign, "; ".join([*notes, f"{policy}{' in one zone' if same_zone else ''}"]))


def _result(assign: Sequence[tuple[Slot, int]], text: str) -> GangPlacement:
    zones = sorted({s.zone_key for s, _ in assign})
    return GangPlacement(
        tuple(assign), _cost(assign), f"{text}: {sum(n for _, n in assign)} nodes over {len(zones)} zone(s)"
    )
