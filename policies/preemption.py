"""Preemption: which running work to stop so that a higher-priority job fits on constrained capacity
(the on-prem pool's hosts, edge devices).

Victims are chosen, per host, among running workloads of strictly lower priority, in this order:

1. least work lost since their last checkpoint (a job that checkpointed a second ago loses a second)
2. lower priority
3. lower QoS class (BestEffort, then Burstable, then Guaranteed)
4. started most recently
5. id (deterministic tie-break)

Victims are added in that order until the preemptor fits, then any victim not actually needed is spared
(checked from the most expensive back, like the Kubernetes scheduler's reprieve step). Among hosts, the
plan losing the least total work wins (then fewer victims, then lower highest victim priority, then host
name). A preemptor whose ``preemptionPolicy`` is ``Never`` preempts nothing.

Design choice: this module only *computes* targets, on a copy of the snapshot (the inputs are immutable
values). Stopping them (SIGTERM with a grace period so they checkpoint), requeueing them as PENDING and
restarting them from their checkpoint is the broker's job (see ``docs/POLICIES.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from policies.priority import NEVER
from policies.qos import QoSClass, qos_class, qos_rank
from policies.workload import Resources, Workload

__all__ = ["REASON", "PreemptionTarget", "PreemptionPlan", "victim_key", "find_victims"]

REASON = "Preempted"
REASON_UNRESOLVABLE = "PreemptionImpossible"


@dataclass(frozen=True, slots=True)
class PreemptionTarget:
    """A workload to stop: its id, host, the seconds of work it loses, and the reason to record."""

    workload_id: str
    host: str | None
    work_lost_seconds: float
    priority: int
    qos: QoSClass
    reason: str


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """Where ``preemptor_id`` will fit (``host``) once ``targets`` are stopped. ``host`` is ``None`` when no
    plan exists; ``explanation`` then says why. An empty ``targets`` with a host means it fits already."""

    preemptor_id: str
    host: str | None
    targets: tuple[PreemptionTarget, ...]
    explanation: str

    @property
    def possible(self) -> bool:
        return self.host is not None


def victim_key(w: Workload, now: datetime) -> tuple[float, int, int, float, str]:
    """Sort key of preemption candidates (see the module docstring): first is preempted first."""
    started = w.started_at.timestamp() if w.started_at is not None else 0.0
    return (
        w.work_lost_seconds(now),
        w.priority,
        qos_rank(qos_class(w.requests, w.limits)),
        -started,
        w.id,
    )


def _plan_on_host(
    preemptor: Workload, host: str, free: Resources, running: Sequence[Workload], now: datetime
) -> list[Workload] | None:
    need = preemptor.per_node
    candidates = sorted(
        (w for w in running if w.host == host and w.priority < preemptor.priority),
        key=lambda w: victim_key(w, now),
    )
    chosen: list[Workload] = []
    avail = free
    for w in candidates:
        if need.fits_in(avail):
            break
        chosen.append(w)
        avail = avail + w.total
    if not need.fits_in(avail):
        return None
    for w in reversed(list(chosen)):  # reprieve victims that are not needed after all
        without = avail - w.total
        if need.fits_in(without):
            chosen.remove(w)
            avail = without
    return chosen


def find_victims(
    preemptor: Workload,
    running: Sequence[Workload],
    free: Mapping[str, Resources],
    *,
    now: datetime,
) -> PreemptionPlan:
    """The cheapest set of running workloads to stop so one node of ``preemptor`` fits on one host.

    ``running`` carry their ``host``; ``free`` is each host's free capacity now. Pure: nothing is changed.
    """
    if not free:
        return PreemptionPlan(preemptor.id, None, (), f"{REASON_UNRESOLVABLE}: no constrained host to preempt on")
    for host in sorted(free):
        if preemptor.per_node.fits_in(free[host]):
            return PreemptionPlan(preemptor.id, host, (), f"fits on {host} without preemption")
    if preemptor.preemption_policy == NEVER:
        return PreemptionPlan(
            preemptor.id, None, (),
            f"{REASON_UNRESOLVABLE}: job {preemptor.id} has preemptionPolicy Never; it waits for capacity",
        )
    best: tuple[tuple[float, int, int, str], str, list[Workload]] | None = None
    for host in sorted(free):
        victims = _plan_on_host(preemptor, host, free[host], running, now)
        if victims is None:
            continue
        cost = (
            sum(v.work_lost_seconds(now) for v in victims),
            len(victims),
            max((v.priority for v in victims), default=-(2**62)),
            host,
        )
        if best is None or cost < best[0]:
            best = (cost, host, victims)
    if best is None:
        return PreemptionPlan(
            preemptor.id, None, (),
            f"{REASON_UNRESOLVABLE}: stopping every lower-priority job (< {preemptor.priority}) on any host "
            f"would not free cpu {preemptor.per_node.cpu:g}, memory {preemptor.per_node.memory_gib:g}Gi, "
            f"gpus {preemptor.per_node.gpus:g}",
        )
    _, host, victims = best
    targets = tuple(
        PreemptionTarget(
            v.id, v.host, v.work_lost_seconds(now), v.priority, qos_class(v.requests, v.limits),
            f"{REASON}: by job {preemptor.id} (priority {preemptor.priority} > {v.priority}) on {host}; "
            f"loses {v.work_lost_seconds(now):.0f} s of work since its last checkpoint",
        )
        for v in sorted(victims, key=lambda v: victim_key(v, now))
    )
    lost = sum(t.work_lost_seconds for t in targets)
    return PreemptionPlan(
        preemptor.id, host, targets, f"preempt {len(targets)} job(s) on {host}, losing {lost:.0f} s of work"
    )
