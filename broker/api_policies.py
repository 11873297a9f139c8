"""HTTP API of the scheduling policies (mounted with ``app.include_router(broker.api_policies.router)``).

=======  ===========================================  =======================================================
method   path                                         what
=======  ===========================================  =======================================================
POST     ``/v1/policies:apply``                       admin: apply ResourceQuota / PriorityClass / Budget /
                                                      Reservation documents (YAML or JSON body: one document,
                                                      a list, or ``{"items": [...]}``); all or nothing
DELETE   ``/v1/policies/{kind}/{name}``               admin: delete one (``?namespace=`` for quotas, budgets)
GET      ``/v1/priorityclasses``                      any token: the priority classes
GET      ``/v1/quotas``, ``/v1/budgets``              admin: every namespace's quotas (with usage) / budgets
GET      ``/v1/reservations``                         admin: the reservations
GET      ``/v1/namespaces/{ns}/quotas``               the namespace's quotas, each key with ``used``/``hard``
GET      ``/v1/namespaces/{ns}/budget``               the namespace's budgets, burn today and this month, and
                                                      the projected month-end spend
GET      ``/v1/namespaces/{ns}/priorityclasses``      the classes the namespace's tokens may name, and its
                                                      allow-list (``null``: the default rule)
PUT      ``/v1/namespaces/{ns}/priorityclasses``      admin: set the allow-list ``{"priorityClassNames": [...]}``
DELETE   ``/v1/namespaces/{ns}/priorityclasses``      admin: remove it (back to the default rule)
=======  ===========================================  =======================================================

Errors: 422 with the field path for an invalid document (``items[1].spec.hard.requests.cpu``), 409 when a
second PriorityClass would be ``globalDefault``, 401/403/404 from the shared auth dependencies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field
from sqlmodel import Session

from broker import policy_store as ps
from broker.api_deps import current_principal, get_clock, get_session, require_admin, require_namespace
from broker.clock import Clock
from broker.errors import NotFoundError, SpecError
from policies import priority as priority_mod
from policies.quota import quota_status

__all__ = ["router"]

router = APIRouter(tags=["policies"])


def _documents(body: bytes, content_type: str) -> list[Mapping[str, Any]]:
    if not body.strip():
        raise SpecError("", "empty body. To fix: send a ResourceQuota, PriorityClass, Budget or Reservation")
    if "json" in content_type:
        try:
            data: Any = json.loads(body)
        except ValueError as exc:
            raise SpecError("", f"the body is not JSON ({exc}). To fix: send a JSON document") from None
        docs = data.get("items") if isinstance(data, Mapping) and "items" in data else data
        docs = docs if isinstance(docs, list) else [docs]
    else:
        from broker.spec import load_documents

        docs = load_documents(body)
        if len(docs) == 1 and isinstance(docs[0], Mapping) and "items" in docs[0]:
            docs = list(docs[0]["items"] or [])
    for i, doc in enumerate(docs):
        if not isinstance(doc, Mapping):
            raise SpecError(f"items[{i}]", f"expected a document (mapping), got {type(doc).__name__}")
    return docs


@router.post("/v1/policies:apply")
async def apply_policies(
    request: Request,
    session: Annotated[Session, Depends(get_session)],
    clock: Annotated[Clock, Depends(get_clock)],
    _admin: Annotated[Any, Depends(require_admin)],
) -> dict[str, Any]:
    """Apply policy documents; all are applied or none (one transaction)."""
    docs = _documents(await request.body(), request.headers.get("content-type", ""))
    applied = ps.apply_documents(session, docs, now=clock.now())
    session.commit()
    return {"applied": [a.to_dict() for a in applied]}


@router.delete("/v1/policies/{kind}/{name}")
def delete_policy(
    kind: str,
    name: str,
    session: Annotated[Session, Depends(get_session)],
    _admin: Annotated[Any, Depends(require_admin)],
    namespace: Annotated[str | None, Query()] = None,
) -> dict[str, Any]:
    if not ps.delete_document(session, kind, name, namespace):
        raise NotFoundError(f"{kind} {name!r} not found. To fix: check GET /v1/{kind.lower()}s")
    session.commit()
    return {"deleted": {"kind": kind, "name": name, "namespace": namespace}}


@router.get("/v1/priorityclasses")
def priority_classes(session: Annotated[Session, Depends(get_session)],
                     _p: Annotated[Any, Depends(current_principal)]) -> dict[str, Any]:
    items = sorted(ps.list_priority_classes(session).values(), key=lambda c: (-c.value, c.name))
    return {"items": [{"name": c.name, "value": c.value, "preemptionPolicy": c.preemption_policy,
                       "globalDefault": c.global_default, "description": c.description} for c in items]}


def _quota_items(session: Session, namespace: str | None) -> list[dict[str, Any]]:
    quotas = ps.list_quotas(session, namespace)
    admitted = ps.active_workloads(session) if quotas else []
    return [
        {"namespace": q.namespace, "name": q.name, "cohort": q.cohort, "borrowingLimit": dict(q.borrowing_limit),
         "status": {line.key: {"used": round(line.used, 6), "hard": line.hard} for line in quota_status(q, admitted)}}
        for q in sorted(quotas, key=lambda q: (q.namespace, q.name))
    ]


@router.get("/v1/quotas")
def all_quotas(session: Annotated[Session, Depends(get_session)],
               _admin: Annotated[Any, Depends(require_admin)]) -> dict[str, Any]:
    return {"items": _quota_items(session, None)}


@router.get("/v1/namespaces/{ns}/quotas")
def namespace_quotas(ns: Annotated[str, Depends(require_namespace)],
                     session: Annotated[Session, Depends(get_session)]) -> dict[str, Any]:
    return {"items": _quota_items(session, ns)}


def _budget_dict(b: Any) -> dict[str, Any]:
    return {"namespace": b.namespace, "name": b.name, "dailyUSD": b.daily_usd, "monthlyUSD": b.monthly_usd,
            "enforcement": b.enforcement}


@router.get("/v1/budgets")
def all_budgets(session: Annotated[Session, Depends(get_session)],
                _admin: Annotated[Any, Depends(require_admin)]) -> dict[str, Any]:
    return {"items": [_budget_dict(b) for b in sorted(ps.list_budgets(session), key=lambda b: (b.namespace, b.name))]}


@router.get("/v1/reservations")
def all_reservations(session: Annotated[Session, Depends(get_session)],
                     _admin: Annotated[Any, Depends(require_admin)]) -> dict[str, Any]:
    return {"items": [
        {"name": r.name, "pool": r.pool, "resources": {"cpu": r.resources.cpu, "memory_gib": r.resources.memory_gib,
                                                         "gpus": r.resources.gpus},
         "priorityClassName": r.priority_class, "namespace": r.namespace}
        for r in sorted(ps.list_reservations(session), key=lambda r: r.name)]}


@router.get("/v1/namespaces/{ns}/budget")
def namespace_budget(ns: Annotated[str, Depends(require_namespace)],
                     session: Annotated[Session, Depends(get_session)],
                     clock: Annotated[Clock, Depends(get_clock)]) -> dict[str, Any]:
    """Budgets of ``ns`` and its burn: spend today, month to date, daily rate, projected month end."""
    budgets = ps.list_budgets(session, ns)
    burn = ps.budget_burn(session, ns, clock.now())
    return {"namespace": ns, "budgets": [_budget_dict(b) for b in budgets], "burn": burn.to_dict()}


class AllowedClassesIn(BaseModel):
    """The PriorityClasses a namespace's tokens may name (the global default class is always usable)."""

    priorityClassNames: list[str] = Field(max_length=1000)  # noqa: N815


def _usable(session: Session, ns: str) -> dict[str, Any]:
    classes = ps.list_priority_classes(session)
    allow = ps.allowed_priority_classes(session, [ns]).get(ns)
    usable = priority_mod.usable_classes(allow, classes)
    return {
        "namespace": ns,
        "allowList": None if allow is None else list(allow),
        "defaultValue": priority_mod.default_value(classes),
        "usable": [{"name": c.name, "value": c.value, "preemptionPolicy": c.preemption_policy}
                   for c in sorted(classes.values(), key=lambda c: (-c.value, c.name)) if c.name in usable],
    }


@router.get("/v1/namespaces/{ns}/priorityclasses")
def namespace_priority_classes(ns: Annotated[str, Depends(require_namespace)],
                               session: Annotated[Session, Depends(get_session)]) -> dict[str, Any]:
    """The PriorityClasses tokens of ``ns`` may name (``usable``) and the namespace's ``allowList`` (``null``: none
    set, so only classes at or below the default priority ``defaultValue``)."""
    return _usable(session, ns)


@router.put("/v1/namespaces/{ns}/priorityclasses")
def put_namespace_priority_classes(
    body: AllowedClassesIn,
    ns: Annotated[str, Depends(require_namespace)],
    session: Annotated[Session, Depends(get_session)],
    clock: Annotated[Clock, Depends(get_clock)],
    _admin: Annotated[Any, Depends(require_admin)],
) -> dict[str, Any]:
    """Set the allow-list of ``ns`` (admin): its tokens may name these classes and the global default."""
    names = priority_mod.check_class_names(body.priorityClassNames, "priorityClassNames")
    ps.set_allowed_priority_classes(session, ns, names, now=clock.now())
    session.commit()
    return _usable(session, ns)


@router.delete("/v1/namespaces/{ns}/priorityclasses")
def delete_namespace_priority_classes(
    ns: Annotated[str, Depends(require_namespace)],
    session: Annotated[Session, Depends(get_session)],
    _admin: Annotated[Any, Depends(require_admin)],
) -> dict[str, Any]:
    """Remove the allow-list of ``ns`` (admin; idempotent): back to the classes at or below the default."""
    ps.set_allowed_priority_classes(session, ns, None)
    session.commit()
    return _usable(session, ns)
