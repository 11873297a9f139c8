"""The fleet as a tree, and alert grouping along it with a root cause.

Levels, top down: ``provider`` -> ``region`` -> ``site``/``pool`` -> ``host``/``device`` -> ``job``. A
label set names the node at its deepest level present (:func:`path_of`).

Grouping (:func:`group_alerts`): a node is *affected* when an alert is on it or on anything below it; it
*fails* when an alert is on it, or when at least ``coverage`` of its known children (and at least
``min_children`` of them) are affected. The root cause of an alert is its highest
failing ancestor whose parent does not fail: the highest common ancestor that explains it and its
neighbours. Alerts with the same root cause form one group. "Known children" come from the topology the
caller passes (every place seen in recent samples), so 2 failing hosts of 2 is a region-level cause,
2 of 40 is not.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["LEVELS", "path_of", "node_name", "Topology", "AlertGroup", "group_alerts"]

LEVELS: tuple[tuple[str, ...], ...] = (("provider",), ("region",), ("site", "pool"), ("host", "device"), ("job",))

Path = tuple[str, ...]  # e.g. ("provider=aws", "region=us-east-1", "host=h1")


def path_of(labels: Mapping[str, str]) -> Path:
    """The topology path of a label set: one ``key=value`` per level that the labels have."""
    out: list[str] = []
    for keys in LEVELS:
        for key in keys:
            if labels.get(key):
                out.append(f"{key}={labels[key]}")
                break
    return tuple(out)


def node_name(path: Path) -> str:
    return "/".join(path) if path else "(fleet)"


class Topology:
    """Known nodes and their children, built from label sets (samples, inventory)."""

    def __init__(self, label_sets: Iterable[Mapping[str, str]] = ()) -> None:
        self.children: dict[Path, set[Path]] = defaultdict(set)
        for labels in label_sets:
            self.add(path_of(labels))

    def add(self, path: Path) -> None:
        for i in range(len(path)):
            self.children[path[:i]].add(path[: i + 1])


@dataclass(frozen=True)
class AlertGroup:
    """Alerts explained by one node: ``root_cause`` (a path), ``explanation``, member indexes."""

    root_cause: Path
    explanation: str
    members: tuple[int, ...]

    @property
    def key(self) -> str:
        return node_name(self.root_cause)


def group_alerts(alert_labels: Sequence[Mapping[str, str]], topology: Topology | None = None, *,
                 coverage: float = 0.5, min_children: int = 2) -> list[AlertGroup]:
    """Group alerts (given by their label sets) by root cause (see the module docstring); the groups are
    ordered by root cause name, members by index."""
    topo = topology or Topology()
    paths = [path_of(lb) for lb in alert_labels]
    for p in paths:
        topo.add(p)
    direct: set[Path] = set(paths)
    affected: dict[Path, bool] = {}
    failing: dict[Path, bool] = {}

    def walk(node: Path) -> bool:  # fills both maps bottom-up; returns whether the subtree has an alert
        kids = topo.children.get(node, set())
        hit = [k for k in kids if walk(k)]
        affected[node] = node in direct or bool(hit)
        failing[node] = node in direct or (
            bool(node) and len(hit) >= min_children and len(hit) >= coverage * len(kids)
        )
        return affected[node]

    walk(())
    groups: dict[Path, list[int]] = defaultdict(list)
    for i, p in enumerate(paths):
        root = next((p[:d] for d in range(1, len(p) + 1) if failing.get(p[:d], False)), p)
        groups[root].append(i)
    out = []
    for root, members in groups.items():
        kids = topo.children.get(root, set())
        hit = sum(1 for k in kids if affected.get(k, False))
        if root in direct and hit < min_children:
            why = f"{len(members)} alert(s) on {node_name(root)}"
        else:
            level = next(iter(kids))[-1].split("=", 1)[0] if kids else "children"
            why = f"{hit} of {len(kids)} {level}(s) under {node_name(root)} alerting"
        out.append(AlertGroup(root, why, tuple(sorted(members))))
    return sorted(out, key=lambda g: g.key)
