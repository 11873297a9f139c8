"""Namespace quotas, shaped like Kubernetes ``ResourceQuota``, with Kueue-style cohorts for borrowing.

A document::

    apiVersion: v1
    kind: ResourceQuota
    metadata: {name: compute, namespace: team-a}
    spec:
      hard:
        requests.cpu: "100"            # cores; "cpu" is the same key, as in Kubernetes
        requests.memory: 400Gi
        limits.nvidia.com/gpu: "8"     # or requests.nvidia.com/gpu
        count/jobs: "50"
      cohort: research                 # extension: namespaces of one cohort lend unused quota to each other
      borrowingLimit:                  # extension: at most this much above `hard` may be borrowed
        requests.cpu: "20"

Enforced at admission over the namespace's admitted and running work (``admitted``). A job fits when,
for every key, ``used + needed <= hard``; exactly full admits nothing more. In a cohort a namespace may go
above ``hard`` by at most its ``borrowingLimit`` (no limit = unbounded, as in Kueue) while the cohort as a
whole stays within the sum of its members' ``hard``. A namespace without a quota is unlimited.

Reasons are readable: ``QuotaExceeded: requests.cpu 96/100, job needs 8 (quota team-a/compute)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.errors import SpecError
from policies.workload import CPU, MEMORY, Resources, Workload, parse_cpu, parse_memory_gib, resources_of

__all__ = [
    "REASON",
    "KEYS",
    "ResourceQuota",
    "QuotaLine",
    "parse_resource_quota",
    "workload_usage",
    "namespace_usage",
    "quota_status",
    "check_quota",
]

REASON = "QuotaExceeded"

_ALIASES = {
    "cpu": "requests.cpu",
    "memory": "requests.memory",
    "requests.cpu": "requests.cpu",
    "requests.memory": "requests.memory",
    "limits.cpu": "limits.cpu",
    "limits.memory": "limits.memory",
    "requests.nvidia.com/gpu": "requests.nvidia.com/gpu",
    "limits.nvidia.com/gpu": "limits.nvidia.com/gpu",
    "nvidia.com/gpu": "requests.nvidia.com/gpu",
    "count/jobs": "count/jobs",
}
KEYS = tuple(sorted(set(_ALIASES.values())))


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    """Hard limits of one ``namespace`` (cores, GiB, GPU and job counts, keyed by canonical names
    such as ``requests.cpu``), with an optional ``cohort`` and per-key ``borrowing_limit``."""

    name: str
    namespace: str
    hard: Mapping[str, float]
    cohort: str | None = None
    borrowing_limit: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QuotaLine:
    """One key of a quota with its ``used`` and ``hard`` amounts (for the API and reasons)."""

    key: str
    used: float
    hard: float


def _canonical(key: str, path: str) -> str:
    canon = _ALIASES.get(key)
    if canon is None:
        raise SpecError(path, f"unsupported quota key {key!r}. To fix: use one of {', '.join(KEYS)}")
    return canon


def _amount(key: str, value: object, path: str) -> float:
    if key.endswith("memory"):
        return parse_memory_gib(value, field_name=path)
    if key == "count/jobs":
        amount = parse_cpu(value, field_name=path)
        if amount != int(amount):
            raise SpecError(path, f"count/jobs must be a whole number, got {value!r}")
        return amount
    return parse_cpu(value, field_name=path)


def _amounts(raw: object, path: str) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError(path, f"expected a mapping of resource to quantity, got {type(raw).__name__}")
    out: dict[str, float] = {}
    for key, value in raw.items():
        canon = _canonical(str(key), f"{path}.{key}")
        out[canon] = _amount(canon, value, f"{path}.{key}")
    return out


def parse_resource_quota(doc: Mapping[str, Any], *, namespace: str | None = None) -> ResourceQuota:
    """Validate a ``ResourceQuota`` document. ``namespace`` fills a missing ``metadata.namespace``.
    Raises :class:`SpecError` naming the field."""
    if doc.get("kind") != "ResourceQuota":
        raise SpecError("kind", f"expected ResourceQuota, got {doc.get('kind')!r}")
    meta = doc.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise SpecError("metadata", "expected a mapping")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError("metadata.name", "a ResourceQuota needs a name")
    ns = meta.get("namespace") or namespace
    if not isinstance(ns, str) or not ns:
        raise SpecError("metadata.namespace", "a ResourceQuota needs a namespace")
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError("spec", "a ResourceQuota needs spec.hard")
    hard = _amounts(spec.get("hard"), "spec.hard")
    if not hard:
        raise SpecError("spec.hard", "is empty. To fix: set e.g. requests.cpu: '100'")
    cohort = spec.get("cohort")
    if cohort is not None and (not isinstance(cohort, str) or not cohort):
        raise SpecError("spec.cohort", "expected a cohort name")
    borrowing = _amounts(spec.get("borrowingLimit"), "spec.borrowingLimit")
    if borrowing and cohort is None:
        raise SpecError("spec.borrowingLimit", "only makes sense with spec.cohort. To fix: add spec.cohort")
    return ResourceQuota(name, ns, hard, cohort, borrowing)


def workload_usage(w: Workload) -> dict[str, float]:
    """What ``w`` counts against each quota key (all nodes): requests, limits (a missing limit counts its
    request), GPUs and one job."""
    req = w.total
    lim = resources_of(w.limits).scale(w.nodes)
    lim = Resources(
        lim.cpu if CPU in w.limits else req.cpu,
        lim.memory_gib if MEMORY in w.limits else req.memory_gib,
        max(lim.gpus, req.gpus),
    )
    return {
        "requests.cpu": req.cpu,
        "requests.memory": req.memory_gib,
        "limits.cpu": lim.cpu,
        "limits.memory": lim.memory_gib,
        "requests.nvidia.com/gpu": req.gpus,
        "limits.nvidia.com/gpu": lim.gpus,
        "count/jobs": 1.0,
    }


def namespace_usage(namespace: str, admitted: Iterable[Workload]) -> dict[str, float]:
    """Sum of :func:`workload_usage` over the ``admitted`` work of ``namespace``."""
    total = dict.fromkeys(KEYS, 0.0)
    for w in admitted:
        if w.namespace == namespace:
            for key, amount in workload_usage(w).items():
                total[key] += amount
    return total


def quota_status(quota: ResourceQuota, admitted: Iterable[Workload]) -> list[QuotaLine]:
    """``used``/``hard`` per key of ``quota`` (what ``GET .../quotas`` shows)."""
    used = namespace_usage(quota.namespace, admitted)
    return [QuotaLine(k, used[k], quota.hard[k]) for k in sorted(quota.hard)]


def _fmt(key: str, amount: float) -> str:
    text = f"{amount:.6g}"
    return f"{text}Gi" if key.endswith("memory") else text


def check_quota(w: Workload, quotas: Sequence[ResourceQuota], admitted: Sequence[Workload]) -> str | None:
    """``None`` when ``w`` fits every quota of its namespace (borrowing within its cohort if needed),
    else the reason it is held, e.g. ``QuotaExceeded: requests.cpu 96/100, job needs 8 (quota team-a/q)``.

    ``admitted`` is the admitted and running work of every namespace (``w`` itself excluded).
    """
    mine = [q for q in quotas if q.namespace == w.namespace]
    if not mine:
        return None
    need = workload_usage(w)
    used = namespace_usage(w.namespace, admitted)
    for quota in sorted(mine, key=lambda q: q.name):
        for key in sorted(quota.hard):
            hard = quota.hard[key]
            if need[key] <= 0 and key != "count/jobs":
                continue
            if used[key] + need[key] <= hard + 1e-9:
                continue
            where = f"quota {quota.namespace}/{quota.name}"
            base = f"{REASON}: {key} {_fmt(key, used[key])}/{_fmt(key, hard)}, job needs {_fmt(key, need[key])}"
            if quota.cohort is None:
                return f"{base} ({where}). To fix: wait for running work to finish or raise spec.hard"
            borrow = used[key] + need[key] - hard
            limit = quota.borrowing_limit.get(key)
            if limit is not None and borrow > limit + 1e-9:
                return (
                    f"{base} ({where}); borrowing {_fmt(key, borrow)} is above the borrowingLimit "
                    f"{_fmt(key, limit)} of cohort {quota.cohort}"
                )
            members = [q for q in quotas if q.cohort == quota.cohort]
            cohort_hard = sum(q.hard.get(key, 0.0) for q in members)
            member_ns = {q.namespace for q in members}
            cohort_used = sum(namespace_usage(ns, admitted)[key] for ns in sorted(member_ns))
            if cohort_used + need[key] > cohort_hard + 1e-9:
                return (
                    f"{base} ({where}); cohort {quota.cohort} has {_fmt(key, cohort_used)}/"
                    f"{_fmt(key, cohort_hard)} in use, nothing left to borrow"
                )
    return None
