"""Fleet operations over HTTP (``/v1/ops/...``): alert rules and alerts, metric history, host heartbeats,
pools and recommendations. Changes, alert rules and heartbeats (the fleet's configuration, hosts and devices of
every namespace) need the admin token. A namespace token reads only what is labelled with its own namespace:
metric series with ``namespace=<its namespace>``, alerts whose labels name it, its pools and recommendations
(issue 17: nothing names another namespace). A bad document (rules YAML, samples, pool spec) is a 422 naming
the field, and nothing is stored.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from broker.api_deps import current_principal, get_state, require_admin
from broker.errors import SpecError
from broker.ops import alerts as alerts_mod
from broker.ops.samples import Sample, label_key, read_series, record, series_names
from broker.reports.store import parse_when
from broker.tenants import Principal

__all__ = ["router"]

router = APIRouter(tags=["ops"])

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,127}$")
MAX_RULES_BYTES = 256 * 1024
MAX_SAMPLES = 10_000


def _bad(exc: Exception) -> HTTPException:
    return HTTPException(status_code=422, detail=str(exc))


def _window(since: str, until: str | None, now: datetime) -> tuple[datetime | None, datetime | None]:
    try:
        return parse_when(since, now=now, field="since"), parse_when(until, now=now, field="until")
    except SpecError as exc:
        raise _bad(exc) from None


# -- alert rules and alerts ------------------------------------------------------------------------------

@router.put("/v1/ops/alert-rules/{name}", summary="Store a rules document (Prometheus-rule-like YAML)")
async def put_alert_rules(name: str, request: Request, _: Annotated[Principal, Depends(require_admin)],
                          hb: Annotated[Any, Depends(get_state)]) -> dict[str, Any]:
    if not _NAME.match(name):
        raise HTTPException(status_code=422, detail="name: lower-case letters, digits and '-', at most 63")
    body = await request.body()
    if len(body) > MAX_RULES_BYTES:
        raise HTTPException(status_code=413, detail=f"a rules document is at most {MAX_RULES_BYTES} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(status_code=422, detail="the body must be UTF-8 YAML") from None

    def store() -> int:
        with hb.store.tx() as session:
            return alerts_mod.put_rules(session, name, text, hb.clock.now())

    try:
        n = await run_in_threadpool(store)
    except SpecError as exc:
        raise _bad(exc) from None
    return {"name": name, "rules": n}


@router.get("/v1/ops/alert-rules", summary="The stored rules documents (admin)")
def list_alert_rules(_: Annotated[Principal, Depends(require_admin)],
                     hb: Annotated[Any, Depends(get_state)]) -> dict[str, Any]:
    import sqlalchemy as sa

    from broker.ops.store import AlertRuleRow

    t = AlertRuleRow.__table__  # type: ignore[attr-defined]
    with hb.store.read() as session:
        rows = session.execute(sa.select(t.c.name, t.c.yaml_text, t.c.updated_at).order_by(t.c.name)).all()
    return {"items": [{"name": r.name, "yaml": r.yaml_text, "updated_at": r.updated_at.isoformat()} for r in rows]}


@router.delete("/v1/ops/alert-rules/{name}", summary="Delete a rules document")
def delete_alert_rules(name: str, _: Annotated[Principal, Depends(require_admin)],
                       hb: Annotated[Any, Depends(get_state)]) -> dict[str, Any]:
    with hb.store.tx() as session:
        if not alerts_mod.delete_rules(session, name):
            raise HTTPException(status_code=404, detail=f"no rules document {name!r}")
    return {"deleted": name}


@router.get("/v1/ops/alerts", summary="Alerts (pending, firing, resolved) with their group and root cause")
def get_alerts(principal: Annotated[Principal, Depends(current_principal)], hb: Annotated[Any, Depends(get_state)],
               state: Annotated[str | None, Query(pattern="^(pending|firing|resolved)$")] = None,
               limit: Annotated[int, Query(ge=1, le=5000)] = 500) -> dict[str, Any]:
    """Alerts, newest first; a namespace token gets only those whose labels name its namespace."""
    with hb.store.read() as session:
        items = alerts_mod.list_alerts(session, state=state, limit=limit)
    if not principal.is_admin:
        items = [a for a in items if a["labels"].get("namespace") == principal.namespace]
    return {"items": items}


@router.post("/v1/ops/alerts/evaluate", summary="Evaluate the rules now and deliver what is due")
def evaluate_alerts(_: Annotated[Principal, Depends(require_admin)],
                    hb: Annotated[Any, Depends(get_state)]) -> dict[str, Any]:
    report = hb.ops.alerts.evaluate()
    delivered = hb.ops.alerts.deliver()
    return {**report.__dict__, "delivery": delivered}


# -- metric history ----------------------------------------------------------------------------------------

class SampleIn(BaseModel):
    name: str = Field(pattern=_METRIC.pattern)
    labels: dict[str, str] = Field(default_factory=dict)
    value: float
    at: datetime | None = None


class SamplesIn(BaseModel):
    samples: list[SampleIn] = Field(min_length=1, max_length=MAX_SAMPLES)


@router.post("/v1/ops/samples", summary="Store metric samples pushed by agents (e.g. a job's measured memory)")
def post_samples(body: SamplesIn, _: Annotated[Principal, Depends(require_admin)],
                 hb: Annotated[Any, Depends(get_state)]) -> dict[str, Any]:
    now = hb.clock.now()
    samples = []
    for i, s in enumerate(body.samples):
        try:
            label_key(s.labels)
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=f"samples[{i}].labels: {exc}") from None
        if s.value != s.value or s.value in (float("inf"), float("-inf")):
            raise HTTPException(status_code=422, detail=f"samples[{i}].value: must be a finite number")
        samples.append(Sample(s.name, s.labels, s.value, s.at or now))
    with hb.store.tx() as session:
        n = record(session, samples)
    return {"stored": n}


@router.get("/v1/ops/metrics", summary="The metric names with stored history")
def metric_names(_: Annotated[Principal, Depends(current_principal)],
                 hb: Annotated[Any, Depends(get_state)]) -> dict[str, Any]:
    with hb.store.read() as session:
        return {"items": series_names(session)}


@router.get("/v1/ops/metrics/{name}", summary="History of one metric: every matching series")
def metric_history(name: str, principal: Annotated[Principal, Depends(current_principal)],
                   hb: Annotated[Any, Depends(get_state)],
                   since: Annotated[str, Query(max_length=64)] = "24h",
                   until: Annotated[str | None, Query(max_length=64)] = None,
                   match: Annotated[list[str] | None, Query(description="label=value, repeatable")] = None,
                   ) -> dict[str, Any]:
    if not _METRIC.match(name):
        raise HTTPException(status_code=422, detail="name: not a metric name")
    selector: dict[str, str] = {}
    for m in match or []:
        if "=" not in m:
            raise HTTPException(status_code=422, detail=f"match: {m!r} is not label=value")
        k, v = m.split("=", 1)
        selector[k] = v
    if not principal.is_admin:  # only the series of its own namespace
        if selector.setdefault("namespace", str(principal.namespace)) != principal.namespace:
            raise HTTPException(status_code=404, detail=f"namespace {selector['namespace']!r} not found. To fix: "
                                                        "ask for your own namespace or omit it")
    since_at, until_at = _window(since, until, hb.clock.now())
    with hb.store.read() as session:
        series = read_series(session, name, selector=selector, since=since_at, until=until_at)
    return {"name": name, "series": [
        {"labels": dict(s.labels), "points": [[float(t), float(v)] for t, v in zip(s.t_seconds, s.values, strict=True)]}
        for s in series]}


# -- heartbeats --------------------------------------------------------------------------------------------

@router.post("/v1/ops/heartbeats/{kind}/{name}", summary="A host's (or device's) heartbeat")
def post_heartbeat(kind: str, name: str, _: Annotated[Principal, Depends(require_admin)],
                   hb: Annotated[Any, Depends(get_state)]) -> dict[str, Any]:
    from broker.ops.health import record_heartbeat

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}", name):
        raise HTTPException(status_code=422, detail="name: letters, digits, '.', '_', ':' or '-' (1..128)")
    try:
        with hb.store.tx() as session:
            return record_heartbeat(session, kind, name, hb.clock.now())
    except SpecError as exc:
        raise _bad(exc) from None


@router.get("/v1/ops/heartbeats", summary="Hosts and their last heartbeat, status and fencing epoch (admin)")
def get_heartbeats(_: Annotated[Principal, Depends(require_admin)],
                   hb: Annotated[Any, Depends(get_state)]) -> dict[str, Any]:
    from broker.ops.health import list_heartbeats

    with hb.store.read() as session:
        return {"items": list_heartbeats(session)}


# -- pools and recommendations -----------------------------------------------------------------------------

@router.put("/v1/ops/pools/{name}", summary="Create or change a broker-owned elastic pool (kind: Pool, YAML or JSON)")
async def put_pool(name: str, request: Request, _: Annotated[Principal, Depends(require_admin)],
                   hb: Annotated[Any, Depends(get_state)]) -> dict[str, Any]:
    from broker.ops.autoscale import put_pool as store_pool

    if not _NAME.match(name):
        raise HTTPException(status_code=422, detail="name: lower-case letters, digits and '-', at most 63")
    from broker.spec import load_documents  # bounded, duplicate keys refused, errors with line and column

    body = await request.body()
    try:
        docs = load_documents(body) if body else []
    except SpecError as exc:
        raise _bad(exc) from None
    if len(docs) > 1:
        raise HTTPException(status_code=422, detail=f"expected one Pool document, got {len(docs)}")
    doc = docs[0] if docs else None

    def store() -> Any:
        with hb.store.tx() as session:
            return store_pool(session, name, doc, hb.clock.now())  # type: ignore[arg-type]

    try:
        spec = await run_in_threadpool(store)
    except SpecError as exc:
        raise _bad(exc) from None
    return {"name": spec.name, "min_replicas": spec.policy.min_replicas, "max_replicas": spec.policy.max_replicas}


@router.get("/v1/ops/pools", summary="Broker-owned pools, their instances and last scaling decision")
def get_pools(principal: Annotated[Principal, Depends(current_principal)],
              hb: Annotated[Any, Depends(get_state)]) -> dict[str, Any]:
    """Pools, each with its instances and last decision; a namespace token gets only its namespace's."""
    from broker.ops.autoscale import list_pools

    with hb.store.read() as session:
        items = list_pools(session)
    return {"items": [p for p in items if principal.is_admin or p["namespace"] == principal.namespace]}


@router.get("/v1/ops/recommendations", summary="VPA requests from measured usage, idle pools, spot candidates")
def get_recommendations(principal: Annotated[Principal, Depends(current_principal)],
                        hb: Annotated[Any, Depends(get_state)],
                        days: Annotated[float, Query(gt=0, le=365)] = 7.0) -> dict[str, Any]:
    import dataclasses

    from broker.ops.vpa import planning_report

    with hb.store.read() as session:
        recs = planning_report(session, hb.clock.now(), window_days=days)
    if not principal.is_admin:
        recs = [r for r in recs if r.namespace == principal.namespace]
    return {"items": [dataclasses.asdict(r) for r in recs]}
