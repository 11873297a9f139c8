"""Reservations: capacity of a pool (the on-prem pool, a host, an edge site) kept for one priority class
or one namespace.

A reservation holds ``resources`` on ``pool`` for the workloads it names (``priority_class`` and/or
``namespace``; a workload matching either is a *holder*). Holders may use the reserved part and whatever
else is free; everyone else sees the pool's free capacity minus the reserved part the holders are not
using right now. Reservations never preempt: they only keep newly freed capacity for their holders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.workload import Resources, Workload

__all__ = ["REASON", "Reservation", "is_holder", "unused_reserved", "usable_capacity", "check_reservation"]

REASON = "ReservedCapacity"


@dataclass(frozen=True, slots=True)
class Reservation:
    """``resources`` of ``pool`` kept for ``priority_class`` and/or ``namespace`` (at least one is set)."""

    name: str
    pool: str
    resources: Resources
    priority_class: str | None = None
    namespace: str | None = None

    def __post_init__(self) -> None:
        if self.priority_class is None and self.namespace is None:
            raise ValueError(
                f"reservation {self.name!r} names no holder. To fix: set priority_class or namespace"
            )


def is_holder(w: Workload, r: Reservation) -> bool:
    """True when ``w`` may use ``r``'s capacity."""
    return (r.priority_class is not None and w.priority_class == r.priority_class) or (
        r.namespace is not None and w.namespace == r.namespace
    )


def unused_reserved(r: Reservation, running: Sequence[Workload]) -> Resources:
    """The part of ``r`` its holders are not using on its pool now."""
    used = Resources.total(x.total for x in running if x.host == r.pool and is_holder(x, r))
    return (r.resources - used).clamp()


def usable_capacity(
    w: Workload, pool: str, free: Resources, reservations: Sequence[Reservation], running: Sequence[Workload]
) -> Resources:
    """What ``w`` may use of ``pool`` whose ``free`` capacity is given: ``free`` minus the unused part of
    every reservation on the pool that ``w`` does not hold (never negative)."""
    held = Resources.total(
        unused_reserved(r, running) for r in reservations if r.pool == pool and not is_holder(w, r)
    )
    return (free - held).clamp()


def _holder(r: Reservation) -> str:
    return f"priorityClass {r.priority_class}" if r.priority_class else f"namespace {r.namespace}"


def check_reservation(
    w: Workload, pool: str, free: Resources, reservations: Sequence[Reservation], running: Sequence[Workload]
) -> str | None:
    """``None`` when one node of ``w`` fits on ``pool`` after honouring the reservations, else
    ``ReservedCapacity: ...`` naming what is kept and for whom."""
    need = w.per_node
    usable = usable_capacity(w, pool, free, reservations, running)
    if need.fits_in(usable):
        return None
    if need.fits_in(free):
        names = ", ".join(
            f"{r.name} (for {_holder(r)})"
            for r in sorted(reservations, key=lambda r: r.name)
            if r.pool == pool and not is_holder(w, r)
        )
        return (
            f"{REASON}: {pool} has cpu {free.cpu:g}, memory {free.memory_gib:g}Gi, gpus {free.gpus:g} free, "
            f"but {names} keep part of it; usable cpu {usable.cpu:g}, memory {usable.memory_gib:g}Gi, "
            f"gpus {usable.gpus:g}, job needs cpu {need.cpu:g}, memory {need.memory_gib:g}Gi, gpus {need.gpus:g}"
        )
    return None  # does not fit even without reservations: capacity, not a reservation, holds it
