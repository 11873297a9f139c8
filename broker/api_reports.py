"""``GET /v1/reports/placements``: the placement report over HTTP (JSON, CSV or HTML).

Query: ``namespace``, ``since`` (``7d``, ``24h``, ISO date or datetime; default ``7d``), ``until``
(default open), ``format`` (``json`` default, ``csv``, ``html``). An admin sees every namespace;
a namespace token sees only its own namespace (asking for another is a 404, as elsewhere).
The JSON body follows ``docs/schemas/placement-report.schema.json``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import Response
from sqlmodel import Session

from broker.api_deps import current_principal, get_clock, get_session, get_settings
from broker.clock import Clock
from broker.config import Settings
from broker.errors import SpecError
from broker.reports import build_report, render
from broker.reports.model import ReportFilters
from broker.reports.store import catalog_store, dry_run_job_ids, load_records, parse_when
from broker.tenants import Principal

__all__ = ["router"]

router = APIRouter(tags=["reports"])

_MEDIA = {"json": "application/json", "csv": "text/csv; charset=utf-8", "html": "text/html; charset=utf-8"}


@router.get(
    "/v1/reports/placements",
    summary="Placement report: spend, savings against baselines, decisions and why",
    responses={200: {"content": {"application/json": {}, "text/csv": {}, "text/html": {}}}},
)
def placements_report(
    principal: Annotated[Principal, Depends(current_principal)],
    session: Annotated[Session, Depends(get_session)],
    settings: Annotated[Settings, Depends(get_settings)],
    clock: Annotated[Clock, Depends(get_clock)],
    namespace: Annotated[
        str | None, Query(max_length=128, description="one namespace (default: all you may see)")
    ] = None,
    since: Annotated[str, Query(max_length=64, description="7d, 24h, 90m, 2w or an ISO date/datetime")] = "7d",
    until: Annotated[str | None, Query(max_length=64, description="same forms as since; default: now")] = None,
    format: Annotated[str, Query(pattern="^(json|csv|html)$", description="json, csv or html")] = "json",  # noqa: A002
) -> Response:
    if not principal.is_admin:
        if namespace is not None and namespace != principal.namespace:
            raise HTTPException(
                status_code=404,
                detail=f"namespace {namespace!r} not found. To fix: ask for your own namespace or omit it",
            )
        namespace = principal.namespace
    now = clock.now()
    try:
        since_at = parse_when(since, now=now, field="since")
        until_at = parse_when(until, now=now, field="until")
    except SpecError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    if since_at is not None and until_at is not None and until_at <= since_at:
        raise HTTPException(status_code=422, detail="until: must be after since. To fix: widen the window")
    records = load_records(session, namespace, since_at, until_at)
    report = build_report(
        records,
        whatif_catalogs=catalog_store(getattr(settings, "data_dir", None)),
        filters=ReportFilters(namespace, since_at, until_at),
        generated_at=now,
        dry_run_jobs=dry_run_job_ids(session, records),
    )
    return Response(content=render(report, format), media_type=_MEDIA[format])
