"""Priority classes, shaped like Kubernetes ``PriorityClass`` (scheduling.k8s.io/v1).

A document::

    apiVersion: scheduling.k8s.io/v1        # or hybrid-broker/v1
    kind: PriorityClass
    metadata: {name: high}
    value: 1000
    preemptionPolicy: PreemptLowerPriority  # or Never
    globalDefault: false
    description: "training that may preempt batch work"

A job names its class with ``priorityClassName``. As in Kubernetes: an unknown name is an error (the
job is held with ``PriorityClassNotFound``), a job without a name gets the ``globalDefault`` class's value
(0 when there is none), at most one class may be the global default, and user values are at most
1,000,000,000.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.errors import ConflictError, SpecError

__all__ = [
    "PREEMPT_LOWER_PRIORITY",
    "NEVER",
    "MAX_USER_PRIORITY",
    "REASON_NOT_FOUND",
    "PriorityClass",
    "ResolvedPriority",
    "parse_priority_class",
    "resolve",
    "check_single_global_default",
]

PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
NEVER = "Never"
MAX_USER_PRIORITY = 1_000_000_000
REASON_NOT_FOUND = "PriorityClassNotFound"
_KINDS_API = ("scheduling.k8s.io/v1", "hybrid-broker/v1")


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority ``value`` (higher schedules first and may preempt lower), with its
    ``preemption_policy`` (``PreemptLowerPriority`` | ``Never``) and whether it is the ``global_default``."""

    name: str
    value: int
    preemption_policy: str = PREEMPT_LOWER_PRIORITY
    global_default: bool = False
    description: str = ""


@dataclass(frozen=True, slots=True)
class ResolvedPriority:
    """The priority a job runs with: its ``value``, ``preemption_policy`` and the class it came from
    (``None`` when no class applies)."""

    value: int
    preemption_policy: str = PREEMPT_LOWER_PRIORITY
    class_name: str | None = None


def parse_priority_class(doc: Mapping[str, Any]) -> PriorityClass:
    """Validate a ``PriorityClass`` document. Raises :class:`SpecError` with the field path."""
    if doc.get("kind") != "PriorityClass":
        raise SpecError("kind", f"expected PriorityClass, got {doc.get('kind')!r}")
    api = doc.get("apiVersion", "scheduling.k8s.io/v1")
    if api not in _KINDS_API:
        raise SpecError("apiVersion", f"{api!r} is not supported. To fix: use scheduling.k8s.io/v1")
    meta = doc.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise SpecError("metadata.name", "a PriorityClass needs a name")
    value = doc.get("value")
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError("value", f"expected an integer, got {value!r}. To fix: e.g. value: 1000")
    if value > MAX_USER_PRIORITY:
        raise SpecError("value", f"{value} is above {MAX_USER_PRIORITY}, which is reserved for the system")
    policy = doc.get("preemptionPolicy", PREEMPT_LOWER_PRIORITY)
    if policy not in (PREEMPT_LOWER_PRIORITY, NEVER):
        raise SpecError("preemptionPolicy", f"{policy!r} is not PreemptLowerPriority or Never")
    default = doc.get("globalDefault", False)
    if not isinstance(default, bool):
        raise SpecError("globalDefault", f"expected true or false, got {default!r}")
    description = doc.get("description", "")
    return PriorityClass(name, value, policy, default, str(description or ""))


def check_single_global_default(classes: Iterable[PriorityClass]) -> None:
    """Raise :class:`ConflictError` when more than one class is ``globalDefault``."""
    defaults = sorted(c.name for c in classes if c.global_default)
    if len(defaults) > 1:
        raise ConflictError(
            f"PriorityClasses {', '.join(defaults)} are all globalDefault; only one may be. "
            "To fix: set globalDefault: false on all but one"
        )


def resolve(
    class_name: str | None, classes: Mapping[str, PriorityClass], *, explicit: int | None = None
) -> ResolvedPriority | str:
    """The priority of a job naming ``class_name`` (``None``: the global default, else 0).

    Returns a reason string (``PriorityClassNotFound: ...``) when the name is unknown: the job is held, not
    silently run at priority 0. ``explicit`` (a raw ``priority`` in the spec) is used only without a class.
    """
    if class_name:
        pc = classes.get(class_name)
        if pc is None:
            known = ", ".join(sorted(classes)) or "none"
            return (
                f"{REASON_NOT_FOUND}: priorityClassName {class_name!r} does not exist (known: {known}). "
                "To fix: apply a PriorityClass of that name or change the job"
            )
        return ResolvedPriority(pc.value, pc.preemption_policy, pc.name)
    if explicit is not None:
        return ResolvedPriority(explicit)
    for pc in sorted(classes.values(), key=lambda c: c.name):
        if pc.global_default:
            return ResolvedPriority(pc.value, pc.preemption_policy, pc.name)
    return ResolvedPriority(0)
