"""Admission: the policy checks the scheduler runs on each pending job before placing it.

Every check has the scheduler's hook shape ``(workload, snapshot) -> None | reason`` and is pure over a
:class:`PolicySnapshot` (plain values the broker loads once per cycle, see
``broker.policy_store.load_snapshot``). ``None`` admits; a reason string holds the job (it stays PENDING
and the reason is shown on ``GET .../jobs/{id}``), except reasons for which
:func:`policies.deadline.is_terminal` is true, which fail the job at once.

Within one cycle the broker admits jobs in queue order and carries the snapshot forward with
:meth:`PolicySnapshot.with_admitted`, so quotas and budgets see the jobs admitted earlier in the same
burst (:func:`admit_in_order` does exactly that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from policies import budget as budget_mod
from policies import deadline as deadline_mod
from policies import priority as priority_mod
from policies import quota as quota_mod
from policies import reservations as reservations_mod
from policies.budget import Budget, SpendEntry
from policies.priority import PriorityClass, ResolvedPriority
from policies.quota import ResourceQuota
from policies.reservations import Reservation
from policies.workload import Resources, Workload

__all__ = [
    "Check",
    "PolicySnapshot",
    "Admission",
    "check_priority_class",
    "check_deadline",
    "check_quota",
    "check_budget",
    "check_reservations",
    "ADMISSION_CHECKS",
    "with_resolved_priority",
    "admit",
    "admit_in_order",
    "adapt",
]

Check = Callable[[Workload, "PolicySnapshot"], str | None]


@dataclass(frozen=True)
class PolicySnapshot:
    """Everything admission reads, as of ``now``.

    ``admitted``: admitted and running work of every namespace (what quotas count). ``spend``: the budget
    ledger. ``pool_free``: free capacity of constrained pools (on-prem hosts, keyed like
    ``Workload.host``), for reservations.
    """

    now: datetime
    admitted: tuple[Workload, ...] = ()
    quotas: tuple[ResourceQuota, ...] = ()
    budgets: tuple[Budget, ...] = ()
    spend: tuple[SpendEntry, ...] = ()
    priority_classes: Mapping[str, PriorityClass] = field(default_factory=dict)
    reservations: tuple[Reservation, ...] = ()
    pool_free: Mapping[str, Resources] = field(default_factory=dict)

    def with_admitted(self, w: Workload, *, host: str | None = None) -> PolicySnapshot:
        """A copy in which ``w`` is admitted: it counts against quotas and its estimate is charged to the
        budget ledger; with ``host`` it also takes one node of capacity from that pool."""
        free = dict(self.pool_free)
        if host is not None and host in free:
            free[host] = free[host] - w.per_node
        return replace(
            self,
            admitted=(*self.admitted, w.with_(host=host) if host is not None else w),
            spend=(*self.spend, SpendEntry(w.namespace, w.estimated_usd, self.now, w.id)),
            pool_free=free,
        )


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome for one job: ``admitted`` or held with ``reason``; ``terminal`` reasons fail the job;
    ``alerts`` are raised either way (soft budgets)."""

    workload_id: str
    admitted: bool
    reason: str | None = None
    terminal: bool = False
    alerts: tuple[str, ...] = ()


def check_priority_class(w: Workload, snap: PolicySnapshot) -> str | None:
    """Hold a job naming an unknown ``priorityClassName``."""
    if w.priority_class is None:
        return None
    resolved = priority_mod.resolve(w.priority_class, snap.priority_classes)
    return resolved if isinstance(resolved, str) else None


def check_deadline(w: Workload, snap: PolicySnapshot) -> str | None:
    """Fail at once a job whose deadline has passed. (Whether some *placement* meets a future deadline is
    decided with the options, by :func:`policies.deadline.choose_for_deadline`.)"""
    if w.deadline is not None and w.deadline <= snap.now:
        return (
            f"{deadline_mod.REASON}: the deadline {w.deadline:%Y-%m-%dT%H:%MZ} has already passed. "
            "To fix: resubmit with a later deadline"
        )
    return None


def check_quota(w: Workload, snap: PolicySnapshot) -> str | None:
    """Hold a job that does not fit its namespace's ResourceQuotas (see :mod:`policies.quota`)."""
    return quota_mod.check_quota(w, snap.quotas, [a for a in snap.admitted if a.id != w.id])


def check_budget(w: Workload, snap: PolicySnapshot) -> str | None:
    """Hold a job whose estimate would cross a hard budget (see :mod:`policies.budget`)."""
    return budget_mod.check_budget(w, snap.budgets, snap.spend, snap.now)


def check_reservations(w: Workload, snap: PolicySnapshot) -> str | None:
    """Hold an on-prem-only job (``providers == ("onprem",)``) that would fit on some pool only by using
    capacity reserved for others. Jobs that may burst elsewhere are not held: placement takes them there."""
    if tuple(w.providers) != ("onprem",) or not snap.pool_free or not snap.reservations:
        return None
    reasons = []
    for pool in sorted(snap.pool_free):
        why = reservations_mod.check_reservation(w, pool, snap.pool_free[pool], snap.reservations, snap.admitted)
        if why is None:
            return None
        reasons.append(why)
    return reasons[0] if reasons else None


ADMISSION_CHECKS: tuple[Check, ...] = (
    check_deadline,
    check_priority_class,
    check_quota,
    check_budget,
    check_reservations,
)


def with_resolved_priority(w: Workload, classes: Mapping[str, PriorityClass]) -> Workload:
    """``w`` with the priority and preemption policy of its class (or of the global default class).
    Unchanged when its class is unknown (:func:`check_priority_class` holds it)."""
    resolved = priority_mod.resolve(w.priority_class, classes, explicit=w.priority if w.priority else None)
    if not isinstance(resolved, ResolvedPriority):
        return w
    return w.with_(
        priority=resolved.value,
        preemption_policy=resolved.preemption_policy,
        priority_class=resolved.class_name or w.priority_class,
    )


def admit(w: Workload, snap: PolicySnapshot, checks: Sequence[Check] = ADMISSION_CHECKS) -> Admission:
    """Run ``checks`` in order; the first reason holds the job."""
    for check in checks:
        reason = check(w, snap)
        if reason is not None:
            return Admission(w.id, False, reason, deadline_mod.is_terminal(reason))
    alerts = tuple(budget_mod.budget_alerts(w, snap.budgets, snap.spend, snap.now))
    return Admission(w.id, True, None, False, alerts)


def admit_in_order(
    workloads: Iterable[Workload], snap: PolicySnapshot, checks: Sequence[Check] = ADMISSION_CHECKS
) -> tuple[list[Admission], PolicySnapshot]:
    """Admit ``workloads`` one after the other (already in queue order), each seeing those admitted before
    it. Returns the outcomes and the snapshot after the last admission."""
    out = []
    for w in workloads:
        result = admit(w, snap, checks)
        out.append(result)
        if result.admitted:
            snap = snap.with_admitted(w)
    return out, snap


def adapt(
    check: Check, to_workload: Callable[[Any], Workload], to_snapshot: Callable[[Any], PolicySnapshot]
) -> Callable[[Any, Any], str | None]:
    """Wrap ``check`` for a scheduler whose hook receives its own job and snapshot objects."""

    def hook(job: Any, snapshot: Any) -> str | None:
        return check(to_workload(job), to_snapshot(snapshot))

    hook.__name__ = getattr(check, "__name__", "check")
    return hook
