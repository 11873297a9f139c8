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

Who may name which class (issue 17): an admin sets, per namespace, the classes its tokens may use
(``AllowedPriorityClasses``)::

    apiVersion: hybrid-broker/v1
    kind: AllowedPriorityClasses
    metadata: {name: allowed, namespace: team-a}
    spec: {priorityClassNames: [high, batch]}

:func:`usable_classes` is the rule: with a list, its classes plus the global default; without one, only the
classes that cannot outrank the default priority (value at most the ``globalDefault`` class's value, 0 when
there is none). So no tenant gets above the default, and so preempts another tenant's default work, unless an
admin granted it, as Kubernetes does with a ``ResourceQuota`` scoped to a PriorityClass and the API server's
``limitedResources`` setting.
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
    "ALLOWED_KIND",
    "REASON_NOT_ALLOWED",
    "parse_allowed_classes",
    "check_class_names",
    "default_value",
    "usable_classes",
    "check_usable",
]

PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
NEVER = "Never"
MAX_USER_PRIORITY = 1_000_000_000
REASON_NOT_FOUND = "PriorityClassNotFound"
REASON_NOT_ALLOWED = "PriorityClassNotAllowed"
ALLOWED_KIND = "AllowedPriorityClasses"
_NAME_MAX = 253
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


def parse_allowed_classes(doc: Mapping[str, Any], *, namespace: str | None = None) -> tuple[str, tuple[str, ...]]:
    """Validate an ``AllowedPriorityClasses`` document: ``(namespace, class names)`` (sorted, unique).

    ``namespace`` fills a missing ``metadata.namespace``. The names need not exist yet (a class may be applied
    later, as a Kubernetes quota may name a class before it exists). Raises :class:`SpecError` with the field."""
    if doc.get("kind") != ALLOWED_KIND:
        raise SpecError("kind", f"expected {ALLOWED_KIND}, got {doc.get('kind')!r}")
    api = doc.get("apiVersion", "hybrid-broker/v1")
    if api != "hybrid-broker/v1":
        raise SpecError("apiVersion", f"{api!r} is not supported. To fix: use hybrid-broker/v1")
    meta = doc.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise SpecError("metadata", "expected a mapping with namespace")
    ns = meta.get("namespace", namespace)
    if not isinstance(ns, str) or not ns:
        raise SpecError("metadata.namespace", "the namespace whose tokens may use these classes, e.g. team-a")
    spec = doc.get("spec")
    names = spec.get("priorityClassNames") if isinstance(spec, Mapping) else None
    if not isinstance(names, list):
        raise SpecError("spec.priorityClassNames", "expected a list of PriorityClass names ([] allows none "
                        "beyond the global default)")
    return ns, check_class_names(names, "spec.priorityClassNames")


def check_class_names(names: Any, field: str) -> tuple[str, ...]:
    """``names`` as a sorted tuple of unique class names; :class:`SpecError` on ``field`` when one is not a
    non-empty string of at most 253 characters, or when there are more than 1000."""
    if not isinstance(names, list | tuple) or len(names) > 1000:
        raise SpecError(field, "expected a list of at most 1000 PriorityClass names")
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name or len(name) > _NAME_MAX or "\x00" in name:
            raise SpecError(f"{field}[{i}]", f"{name!r} is not a PriorityClass name")
    return tuple(sorted(set(names)))


def default_value(classes: Mapping[str, PriorityClass]) -> int:
    """The priority a job without a class gets: the ``globalDefault`` class's value, else 0."""
    return next((c.value for c in classes.values() if c.global_default), 0)


def usable_classes(allowed: Iterable[str] | None, classes: Mapping[str, PriorityClass]) -> set[str]:
    """Names of the existing classes a namespace token may name (see the module docstring): ``allowed`` (the
    namespace's list, ``None`` when the admin set none) plus the global default; without a list, every class
    whose value is at most :func:`default_value`."""
    if allowed is None:
        ceiling = default_value(classes)
        return {c.name for c in classes.values() if c.value <= ceiling}
    return {n for n in allowed if n in classes} | {c.name for c in classes.values() if c.global_default}


def check_usable(
    class_name: str, namespace: str, allowed: Iterable[str] | None, classes: Mapping[str, PriorityClass]
) -> str | None:
    """``None`` when a token of ``namespace`` may name ``class_name``, else the reason (``PriorityClassNotAllowed:
    ...``). An unknown class is left to :func:`resolve` (``PriorityClassNotFound``)."""
    if class_name not in classes:
        return None
    usable = usable_classes(allowed, classes)
    if class_name in usable:
        return None
    which = ", ".join(sorted(usable)) or "none"
    why = ("no allow-list is set, so only classes at or below the default priority "
           f"({default_value(classes)}) are usable" if allowed is None else "it is not on the namespace's allow-list")
    return (f"{REASON_NOT_ALLOWED}: namespace {namespace!r} may not use priorityClassName {class_name!r} "
            f"({why}; usable: {which}). To fix: ask an admin to allow it "
            f"(broker policies allow {namespace} {class_name}), or use one of the usable classes")
