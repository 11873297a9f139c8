"""Consolidation, as Karpenter does it: move work off under-used instances when that is cheaper.

For each instance (cheapest to disrupt first: fewest jobs, then lowest utilization, then name):

* **delete** when its jobs fit in the free capacity of the other instances that stay (first-fit
  decreasing by vCPU), so the instance's whole price is saved;
* else **replace** when its jobs fit on one cheaper offer from ``offers`` (the cheapest that fits).

A planned move takes the free capacity it uses, so later decisions see it; an instance that received
moved jobs is not disrupted itself, and one being replaced receives none. Instances with a job marked
``do_not_disrupt`` (Karpenter's ``karpenter.sh/do-not-disrupt``) stay. Pure function of values; carrying
the plan out (checkpoint, requeue, terminate) is the broker's job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Node", "Pod", "OfferShape", "Action", "plan_consolidation"]


@dataclass(frozen=True)
class Pod:
    id: str
    vcpus: float
    memory_gib: float
    do_not_disrupt: bool = False


@dataclass(frozen=True)
class Node:
    id: str
    vcpus: float
    memory_gib: float
    hourly_usd: float
    pods: tuple[Pod, ...] = ()

    @property
    def used_vcpus(self) -> float:
        return sum(p.vcpus for p in self.pods)

    @property
    def used_memory_gib(self) -> float:
        return sum(p.memory_gib for p in self.pods)


@dataclass(frozen=True)
class OfferShape:
    instance_type: str
    vcpus: float
    memory_gib: float
    hourly_usd: float


@dataclass(frozen=True)
class Action:
    kind: str  # delete | replace
    node: str
    moves: tuple[tuple[str, str], ...] = ()  # (pod, destination node) for delete
    replacement: OfferShape | None = None
    saving_usd_per_hour: float = 0.0
    reason: str = ""


@dataclass
class _Free:
    vcpus: float
    memory_gib: float
    received: list[str] = field(default_factory=list)


def _fits(free: _Free, pod: Pod) -> bool:
    return pod.vcpus <= free.vcpus + 1e-9 and pod.memory_gib <= free.memory_gib + 1e-9


def plan_consolidation(nodes: Sequence[Node], offers: Sequence[OfferShape] = ()) -> list[Action]:
    """The consolidation actions for ``nodes`` (see the module docstring)."""
    free = {n.id: _Free(n.vcpus - n.used_vcpus, n.memory_gib - n.used_memory_gib) for n in nodes}
    gone: set[str] = set()
    actions: list[Action] = []
    order = sorted(nodes, key=lambda n: (len(n.pods), n.used_vcpus / n.vcpus if n.vcpus else 0.0, n.id))
    for node in order:
        if free[node.id].received or any(p.do_not_disrupt for p in node.pods):
            continue
        others = [n for n in nodes if n.id != node.id and n.id not in gone]
        trial = {n.id: _Free(free[n.id].vcpus, free[n.id].memory_gib) for n in others}
        moves: list[tuple[str, str]] = []
        for pod in sorted(node.pods, key=lambda p: (-p.vcpus, -p.memory_gib, p.id)):
            dest = next((n.id for n in others if _fits(trial[n.id], pod)), None)
            if dest is None:
                break
            trial[dest].vcpus -= pod.vcpus
            trial[dest].memory_gib -= pod.memory_gib
            moves.append((pod.id, dest))
        if len(moves) == len(node.pods):
            for n in others:
                free[n.id].vcpus, free[n.id].memory_gib = trial[n.id].vcpus, trial[n.id].memory_gib
            for _, dest in moves:
                free[dest].received.append(node.id)
            gone.add(node.id)
            actions.append(Action("delete", node.id, tuple(moves), None, node.hourly_usd,
                                  f"its {len(node.pods)} job(s) fit on other instances"))
            continue
        cheaper = sorted((o for o in offers if o.hourly_usd < node.hourly_usd - 1e-9
                          and o.vcpus + 1e-9 >= node.used_vcpus and o.memory_gib + 1e-9 >= node.used_memory_gib),
                         key=lambda o: (o.hourly_usd, o.instance_type))
        if cheaper and node.pods:
            o = cheaper[0]
            gone.add(node.id)  # being replaced: not a destination for other moves
            actions.append(Action("replace", node.id, (), o, node.hourly_usd - o.hourly_usd,
                                  f"{node.used_vcpus:g} vCPU / {node.used_memory_gib:g} GiB used fit on "
                                  f"{o.instance_type} (${o.hourly_usd:g}/h)"))
    return actions
