"""The ``/v1`` HTTP API of the broker (tenants, jobs, previews, catalog) plus health and metrics.

Contract (the issue's): ``POST /v1/namespaces`` -> 201; ``POST /v1/namespaces/{ns}/tokens`` -> 201
``{"token"}``; ``POST /v1/namespaces/{ns}/jobs`` with one spec (JSON or YAML) -> 201 job summary, with a
list (a burst, accepted atomically) -> 201 ``{"jobs": [...]}`` in order; ``Idempotency-Key`` replays the
first response of a key; ``GET .../jobs`` lists with filters and cursor pagination; ``GET .../jobs/{id}``
returns ``id``, ``state``, ``placement`` (the OPTION object of ``broker place --json``, or null) and
``events``; ``DELETE .../jobs/{id}`` cancels. Errors are JSON ``{"detail": "...", "field": "..."}``:
422 invalid spec (``field`` is the path), 413 body too large, 404 unknown namespace or job, 401 bad token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import orjson
import sqlalchemy as sa
from fastapi import APIRouter, Body, Depends, Header, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field
from sqlmodel import Session

from broker.api_deps import (
    current_principal,
    get_session,
    get_state,
    get_store,
    require_admin,
    require_namespace,
    token_cache,
)
from broker.api_models import (
    ERROR,
    ERRORS,
    JOB_BODY,
    JobDetailOut,
    JobListOut,
    JobOut,
    JobsOut,
    NamespaceOut,
    NamespacesOut,
    OffersOut,
    PreviewOut,
    TokenCreatedOut,
    TokenRevokedOut,
    TokensOut,
    WhoAmIOut,
    documented,
)
from broker.errors import ConflictError, ForbiddenError, NotFoundError, SpecError
from broker.lifecycle import note, submit_jobs, transition
from broker.model import TERMINAL_STATES, JobState
from broker.store import AttemptRow, IdempotencyRow, JobEventRow, JobLabelRow, JobRow, Store
from broker.tenants import (
    Principal,
    create_namespace,
    create_token,
    list_namespaces,
    list_tokens,
    revoke_token,
)

__all__ = ["router", "job_detail", "job_summary", "read_body", "write_submissions", "submission_weight"]

log = logging.getLogger("broker.api")

router = APIRouter()

_jobs = JobRow.__table__  # type: ignore[attr-defined]
_labels = JobLabelRow.__table__  # type: ignore[attr-defined]
_events = JobEventRow.__table__  # type: ignore[attr-defined]
_attempts = AttemptRow.__table__  # type: ignore[attr-defined]
_idem = IdempotencyRow.__table__  # type: ignore[attr-defined]

_ERR, _ERRORS = ERROR, ERRORS  # typed error answers (broker.api_models)


class NamespaceIn(BaseModel):
    name: str = Field(max_length=253)


class TokenIn(BaseModel):
    description: str = Field(default="", max_length=200)


# ------------------------------------------------------------------------------------------ helpers


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def job_summary(row: Any, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The list form of a job (``row`` is a ``jobs`` row or mapping)."""
    return {
        "id": row.id,
        "name": row.name,
        "namespace": row.namespace,
        "state": row.state,
        "priority": row.priority,
        "created_at": _iso(row.created_at),
        "updated_at": _iso(row.updated_at),
        "provider": row.provider,
        "region": row.region,
        "dry_run": bool(row.dry_run),
        "held_reason": row.held_reason,
        "labels": labels or {},
    }


def job_detail(session: Session, row: Any) -> dict[str, Any]:
    """The full form of a job: spec, state, placement with cost breakdown, instances, attempts, events."""
    labels = {
        k: v
        for k, v in session.execute(sa.select(_labels.c.key, _labels.c.value).where(_labels.c.job_id == row.id))
    }
    events = [
        {
            "at": _iso(e.at),
            "from": e.from_state,
            "to": e.to_state,
            "reason": e.reason,
            **({"data": json.loads(e.data_json)} if e.data_json else {}),
        }
        for e in session.execute(
            sa.select(_events).where(_events.c.job_id == row.id).order_by(_events.c.id)
        )
    ]
    attempts = [
        {
            "at": _iso(a.at),
            "request_id": a.request_id,
            "provider": a.provider,
            "region": a.region,
            "instance_type": a.instance_type,
            "capacity": a.capacity,
            "outcome": a.outcome,
            "message": a.message,
            "delay_seconds": a.delay_seconds,
            "retryable": a.retryable,
        }
        for a in session.execute(
            sa.select(_attempts).where(_attempts.c.job_id == row.id).order_by(_attempts.c.id)
        )
    ]
    placement = _loads(row.placement_json)
    out = job_summary(row, labels)
    out.update(
        {
            "spec": json.loads(row.spec_json),
            "placement": placement,
            "cost": None
            if placement is None
            else {k: placement.get(k) for k in ("hourly_usd", "compute_usd", "egress_usd", "total_usd")},
            "instances": _loads(row.instances_json) or [],
            "retries": row.retries,
            "message": row.message,
            "exit_code": row.exit_code,
            "started_at": _iso(row.started_at),
            "finished_at": _iso(row.finished_at),
            "not_before": _iso(row.not_before),
            "cancel_requested_at": _iso(getattr(row, "cancel_requested_at", None)),
            "attempts": attempts,
            "events": events,
        }
    )
    return out


async def read_body(request: Request) -> bytes:
    """The request body, refusing (413) more than ``BROKER_MAX_BODY_BYTES`` even when streamed."""
    limit = request.app.state.hb.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(status_code=413, detail=_too_large(limit))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(status_code=413, detail=_too_large(limit))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> str:
    return (
        f"request body exceeds {limit} bytes. To fix: send fewer jobs per request, or raise "
        "BROKER_MAX_BODY_BYTES on the server"
    )


def _parse_payload(body: bytes, content_type: str) -> Any:
    from broker.spec import load_documents

    if not body.strip():
        raise SpecError("", "empty body. To fix: send a job spec (JSON or YAML) or a list of them")
    if "json" in content_type:
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise SpecError("", f"malformed JSON: {exc}. To fix: send valid JSON") from None
    docs = load_documents(body)
    if not docs:
        raise SpecError("", "the body holds no job spec")
    if len(docs) == 1 and not _yaml_top_is_list(body):
        return docs[0]
    return docs


def _yaml_top_is_list(body: bytes) -> bool:
    """True when the first YAML content line is a sequence item (``- ...``), i.e. the body is a list."""
    for raw in body.splitlines():
        line = raw.strip()
        if not line or line.startswith((b"#", b"%")) or line in (b"---", b"..."):
            continue
        if line.startswith(b"--- "):
            line = line[4:].lstrip()
        return line == b"-" or line.startswith((b"- ", b"["))
    return False


# ------------------------------------------------------------------------------------------ health


@router.get("/healthz", tags=["health"])
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", tags=["health"], responses={503: _ERR})
def readyz(request: Request, store: Annotated[Store, Depends(get_store)]) -> JSONResponse:
    """Readiness: the store answers and the catalog is loaded."""
    hb = request.app.state.hb
    checks = {"store": store.ping(), "catalog": hb.catalog is not None}
    ok = all(checks.values())
    return JSONResponse({"status": "ok" if ok else "not ready", "checks": checks}, status_code=200 if ok else 503)


@router.get("/metrics", tags=["health"], response_class=PlainTextResponse, responses={401: _ERR, 403: _ERR})
def metrics(request: Request, _admin: Annotated[Principal, Depends(require_admin)]) -> Response:
    """Prometheus text exposition (jobs by state, queue wait and placement latency, provider errors)."""
    from broker.metrics import CONTENT_TYPE

    return Response(request.app.state.hb.metrics.render(), media_type=CONTENT_TYPE)


# ------------------------------------------------------------------------------------------ tenants


@router.get("/v1/whoami", tags=["tenants"], response_model=None, responses=documented(WhoAmIOut))
def whoami(principal: Annotated[Principal, Depends(current_principal)]) -> dict[str, Any]:
    """Who the token belongs to: ``{"admin": bool, "namespace": str | null, "token_id": str}``."""
    return {"admin": principal.is_admin, "namespace": principal.namespace, "token_id": principal.token_id}


@router.post("/v1/namespaces", status_code=201, tags=["tenants"], response_model=None,
              responses=documented(NamespaceOut, 201, 403, 409))
def post_namespace(
    body: NamespaceIn,
    _admin: Annotated[Principal, Depends(require_admin)],
    store: Annotated[Store, Depends(get_store)],
    hb: Annotated[Any, Depends(get_state)],
) -> dict[str, Any]:
    """Create a namespace (admin). 409 when it exists, 422 for a bad name."""
    with store.tx() as session:
        row = create_namespace(session, body.name, now=hb.clock.now())
    return {"name": row.name, "created_at": _iso(row.created_at)}


@router.get("/v1/namespaces", tags=["tenants"], response_model=None, responses=documented(NamespacesOut))
def get_namespaces(
    principal: Annotated[Principal, Depends(current_principal)],
    session: Annotated[Session, Depends(get_session)],
) -> dict[str, Any]:
    """Namespaces the caller can see (all for an admin, its own for a namespace token)."""
    rows = [r for r in list_namespaces(session) if principal.can_access(r.name)]
    return {"namespaces": [{"name": r.name, "created_at": _iso(r.created_at)} for r in rows]}


@router.post("/v1/namespaces/{ns}/tokens", status_code=201, tags=["tenants"], response_model=None,
             responses=documented(TokenCreatedOut, 201, 403))
def post_token(
    ns: str,
    _admin: Annotated[Principal, Depends(require_admin)],
    store: Annotated[Store, Depends(get_store)],
    hb: Annotated[Any, Depends(get_state)],
    body: Annotated[TokenIn | None, Body()] = None,
) -> dict[str, Any]:
    """Create an API token of namespace ``ns`` (admin). The secret is in the answer only."""
    with store.tx() as session:
        row, secret = create_token(session, ns, now=hb.clock.now(), description=body.description if body else "")
    return {"id": row.id, "namespace": ns, "token": secret, "created_at": _iso(row.created_at)}


@router.get("/v1/namespaces/{ns}/tokens", tags=["tenants"], response_model=None,
            responses=documented(TokensOut, 200, 403))
def get_tokens(
    ns: str,
    _admin: Annotated[Principal, Depends(require_admin)],
    session: Annotated[Session, Depends(get_session)],
) -> dict[str, Any]:
    """Tokens of ``ns`` without their secrets (admin)."""
    from broker.tenants import namespace_exists

    if not namespace_exists(session, ns):
        raise NotFoundError(f"namespace {ns!r} not found. To fix: broker namespaces create {ns}")
    return {
        "tokens": [
            {"id": t.id, "namespace": t.namespace, "description": t.description,
             "created_at": _iso(t.created_at), "revoked_at": _iso(t.revoked_at)}
            for t in list_tokens(session, ns)
        ]
    }


@router.delete("/v1/tokens/{token_id}", tags=["tenants"], response_model=None,
               responses=documented(TokenRevokedOut, 200, 403))
def delete_token(
    token_id: str,
    _admin: Annotated[Principal, Depends(require_admin)],
    store: Annotated[Store, Depends(get_store)],
    hb: Annotated[Any, Depends(get_state)],
) -> dict[str, Any]:
    """Revoke a token (admin; idempotent). The token answers 401 from then on."""
    with store.tx() as session:
        row = revoke_token(session, token_id, now=hb.clock.now())
    token_cache(hb).invalidate()  # after the commit: from now on this process asks the store again
    return {"id": row.id, "namespace": row.namespace, "revoked_at": _iso(row.revoked_at)}


# ------------------------------------------------------------------------------------------ jobs


@dataclass(frozen=True)
class _Submission:
    """A parsed submission, ready for the writer: the specs, their stored documents, and the key."""

    ns: str
    key: str | None
    digest: str
    now: datetime
    specs: list[Any]
    docs: list[str]
    burst: bool
    restricted: bool = False  # a namespace token: only the PriorityClasses its namespace may use


# Bodies up to this size (JSON) are parsed on the event loop (~40 us per spec); larger ones and YAML
# in the threadpool, so a big burst never stalls the other requests.
_INLINE_PARSE_BYTES = 16 * 1024


def _prepare_submission(hb: Any, ns: str, body: bytes, content_type: str, key: str | None) -> _Submission:
    """Parse and validate a submission body (no store access); raises :class:`SpecError` for bad input."""
    from broker.spec import specs_from_payload

    now = hb.clock.now()
    payload = _parse_payload(body, content_type)
    burst = isinstance(payload, list) or (isinstance(payload, dict) and set(payload) == {"jobs"})
    if isinstance(payload, list) and len(payload) > hb.settings.max_burst_jobs:
        raise SpecError("", f"a burst of {len(payload)} jobs exceeds the limit of {hb.settings.max_burst_jobs}. "
                        "To fix: split it into several requests")
    specs = specs_from_payload(payload, now=now, default_namespace=ns)
    for i, spec in enumerate(specs):
        if spec.namespace not in (None, ns):
            raise SpecError(
                f"{f'[{i}].' if burst else ''}metadata.namespace",
                f"{spec.namespace!r} differs from the namespace of the URL ({ns!r}). To fix: drop "
                "metadata.namespace or post to its namespace",
            )
    docs = [json.dumps(spec.raw, separators=(",", ":"), default=str) for spec in specs]
    return _Submission(ns, key, hashlib.sha256(body).hexdigest(), now, specs, docs, burst)


class _DuplicateKeyInBatch(Exception):
    """Two submissions of one batch carry the same key: the writer then stores them one by one."""


Outcome = tuple[int, Any, bool] | BaseException


def write_submissions(session: Session, subs: list[_Submission], *, clock: Any) -> list[Outcome]:
    """Store a batch of submissions in ``session`` (the write function of the app's
    :class:`~broker.store.GroupCommitter`): one outcome per submission, in order, either
    ``(status, answer, replayed)`` or the :class:`SpecError` refusing it alone.

    A submission whose key was used before gets that key's first answer (or the 422 of a key reused with
    another body); the others are inserted with one :func:`broker.lifecycle.submit_jobs` per namespace
    (jobs keep the order of arrival, ``created_at`` is the time of this write) and one insert of the keys'
    answers. Priority classes are read once.
    """
    now = clock.now()
    outcomes: list[Outcome | None] = [None] * len(subs)
    keyed = [(i, sub) for i, sub in enumerate(subs) if sub.key is not None]
    if keyed:
        if len({(sub.ns, sub.key) for _, sub in keyed}) < len(keyed):
            raise _DuplicateKeyInBatch
        found = {
            (r.namespace, r.key): r
            for r in session.execute(
                sa.select(_idem.c.namespace, _idem.c.key, _idem.c.request_sha256, _idem.c.status_code,
                          _idem.c.response_json).where(
                    _idem.c.namespace.in_({sub.ns for _, sub in keyed}),
                    _idem.c.key.in_({sub.key for _, sub in keyed}),
                )
            )
        }
        for i, sub in keyed:
            row = found.get((sub.ns, sub.key))
            if row is not None:
                outcomes[i] = (
                    _key_reused() if row.request_sha256 != sub.digest
                    else (row.status_code, json.loads(row.response_json), True)
                )
    classes = _priority_classes(session)
    restricted = {sub.ns for i, sub in enumerate(subs) if outcomes[i] is None and sub.restricted
                  and any(spec.priority_class_name for spec in sub.specs)}
    allow_lists = _allow_lists(session, restricted) if restricted and classes else {}
    priorities: dict[int, list[int]] = {}
    by_ns: dict[str, list[int]] = {}
    for i, sub in enumerate(subs):
        if outcomes[i] is not None:
            continue
        try:
            if sub.ns in restricted:
                _refuse_classes_not_allowed(classes, allow_lists.get(sub.ns), sub)
            priorities[i] = _resolve_priorities(classes, sub.specs, sub.burst)
        except SpecError as exc:
            outcomes[i] = exc
            continue
        by_ns.setdefault(sub.ns, []).append(i)
    answers: list[dict[str, Any]] = []
    for ns, idxs in by_ns.items():
        specs, docs, autosized = _autosize(session, ns, [spec for i in idxs for spec in subs[i].specs],
                                           [doc for i in idxs for doc in subs[i].docs], now)
        jobs = submit_jobs(session, ns, specs, now=now, spec_docs=docs,
                           priorities=[p for i in idxs for p in priorities[i]])
        for k, text in autosized.items():
            note(session, jobs[k]["id"], JobState.PENDING, text, now=now)
        pos = 0
        for i in idxs:
            sub = subs[i]
            mine, pos = jobs[pos : pos + len(sub.specs)], pos + len(sub.specs)
            response: Any = {"jobs": mine} if sub.burst else mine[0]
            outcomes[i] = (201, response, False)
            if sub.key is not None:
                answers.append({"namespace": ns, "key": sub.key, "request_sha256": sub.digest, "status_code": 201,
                                "response_json": json.dumps(response), "created_at": now})
    if answers:
        session.connection().execute(_idem.insert(), answers)
    return [o for o in outcomes if o is not None]


def _autosize(session: Session, ns: str, specs: list[Any], docs: list[str], now: datetime
              ) -> tuple[list[Any], list[str], dict[int, str]]:
    """The specs and stored documents to write, with the requests of those that ask for it
    (``spec.verticalScaling.updateMode: Initial``) lowered to the recommendation from their earlier runs
    (:func:`broker.ops.vpa.autosize_doc`), and the event text by position. New lists: a submission is
    never changed, so a batch written again after a rollback is lowered (and noted) again."""
    specs, docs = list(specs), list(docs)
    notes: dict[int, str] = {}
    usage: dict[tuple[str, str], dict[str, list[float]]] = {}  # measured once per job name of the batch
    for k, spec in enumerate(specs):
        if ((spec.raw.get("spec") or {}).get("verticalScaling") or {}).get("updateMode") != "Initial":
            continue
        from broker.ops.vpa import autosize_doc, autosize_text
        from broker.spec import parse_job_spec

        done = autosize_doc(session, spec.raw, ns, now, usage=usage)
        if done is not None:
            specs[k] = parse_job_spec(done[0], now=now)
            docs[k] = json.dumps(specs[k].raw, separators=(",", ":"), default=str)
            notes[k] = autosize_text(done[1])
    return specs, docs, notes


def _priority_classes(session: Session) -> dict[str, Any]:
    """Every PriorityClass by name (one Core query; what :func:`broker.policy_store.list_priority_classes`
    returns, without building ORM objects)."""
    from broker.policy_store import PriorityClassRecord
    from policies.priority import PriorityClass

    t = PriorityClassRecord.__table__  # type: ignore[attr-defined]
    rows = session.execute(sa.select(t.c.name, t.c.value, t.c.preemption_policy, t.c.global_default,
                                     t.c.description))
    return {r.name: PriorityClass(r.name, r.value, r.preemption_policy, r.global_default, r.description)
            for r in rows}


def _allow_lists(session: Session, namespaces: set[str]) -> dict[str, tuple[str, ...]]:
    from broker.policy_store import allowed_priority_classes

    return allowed_priority_classes(session, namespaces)


def _refuse_classes_not_allowed(classes: dict[str, Any], allowed: tuple[str, ...] | None, sub: _Submission) -> None:
    """A namespace token names only the PriorityClasses its namespace may use (:func:`policies.priority.check_usable`:
    the admin's allow-list, else the classes at or below the default priority): else 403 on the field."""
    from policies.priority import check_usable

    for i, spec in enumerate(sub.specs):
        if spec.priority_class_name:
            reason = check_usable(spec.priority_class_name, sub.ns, allowed, classes)
            if reason is not None:
                raise ForbiddenError(f"{f'[{i}].' if sub.burst else ''}spec.priorityClassName", reason)


def _resolve_priorities(classes: dict[str, Any], specs: list[Any], burst: bool) -> list[int]:
    """The priority to store with each spec: its ``priorityClassName``'s value, else its raw ``priority``,
    else the ``globalDefault`` class's value, else 0 (:func:`policies.priority.resolve`). An unknown class
    is a :class:`SpecError` on ``spec.priorityClassName`` (422)."""
    from policies.priority import resolve

    out: list[int] = []
    for i, spec in enumerate(specs):
        resolved = resolve(spec.priority_class_name, classes, explicit=spec.priority)
        if isinstance(resolved, str):
            raise SpecError(f"{f'[{i}].' if burst else ''}spec.priorityClassName", resolved)
        out.append(resolved.value)
    return out


def _refuse_raw_priority(specs: list[Any], burst: bool) -> None:
    """A namespace token may lower its own jobs (``spec.priority`` <= 0) but not raise them: priorities above
    0 come from PriorityClasses, which only an admin applies (issue 17: no tenant preempts another at will)."""
    for i, spec in enumerate(specs):
        if spec.priority is not None and spec.priority > 0 and not spec.priority_class_name:
            raise SpecError(f"{f'[{i}].' if burst else ''}spec.priority",
                            f"a namespace token cannot set priority {spec.priority} (> 0). To fix: use a "
                            "priorityClassName an admin applied (broker policies apply), or drop spec.priority")


def _key_reused() -> SpecError:
    return SpecError(
        "Idempotency-Key",
        "this key was already used with a different body. To fix: use a new key for a new request",
    )


def _replay_in(session: Session, ns: str, key: str, digest: str) -> tuple[int, Any] | None:
    row = session.execute(
        sa.select(_idem.c.request_sha256, _idem.c.status_code, _idem.c.response_json).where(
            _idem.c.namespace == ns, _idem.c.key == key
        )
    ).first()
    if row is None:
        return None
    if row.request_sha256 != digest:
        raise _key_reused()
    return row.status_code, json.loads(row.response_json)


def submission_weight(sub: _Submission) -> int:
    """How many jobs ``sub`` holds (the writer's batch weight)."""
    return len(sub.specs)


def _replay(store: Store, ns: str, key: str, digest: str) -> tuple[int, Any] | None:
    with store.read() as session:
        return _replay_in(session, ns, key, digest)


def _json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response encoded with orjson (same JSON as ``JSONResponse`` for these plain documents)."""
    return Response(orjson.dumps(content), status_code=status_code, headers=headers, media_type="application/json")


@router.post(
    "/v1/namespaces/{ns}/jobs", status_code=201, tags=["jobs"], openapi_extra=JOB_BODY,
    responses={201: {"model": JobOut | JobsOut, "description": 'the job (one spec), or `{"jobs": [...]}` (a burst)'},
               **ERRORS},
)
async def post_jobs(
    request: Request,
    ns: Annotated[str, Depends(require_namespace)],
    hb: Annotated[Any, Depends(get_state)],
    principal: Annotated[Principal, Depends(current_principal)],
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Response:
    """Submit one job spec (answer: the job) or a burst (answer: ``{"jobs": [...]}``, all or nothing).

    With ``Idempotency-Key`` a retry replays the first answer of that key.
    \f
    The body is parsed here (small JSON bodies on the event loop, others in the threadpool) and stored
    by the app's single writer (:class:`broker.store.GroupCommitter`), which commits the submissions
    that arrive together in one transaction; the answer is sent only after that commit.
    """
    body = await read_body(request)
    content_type = request.headers.get("content-type", "").lower()
    key = (idempotency_key.strip() if idempotency_key else None) or None
    try:
        if len(body) <= _INLINE_PARSE_BYTES and "json" in content_type:
            sub = _prepare_submission(hb, ns, body, content_type, key)
        else:
            sub = await run_in_threadpool(_prepare_submission, hb, ns, body, content_type, key)
    except SpecError:
        # A retry of an accepted request is replayed even if its body would no longer validate (e.g. a
        # deadline that has passed since); a key reused with another body is the key's 422.
        replay = None if key is None else await run_in_threadpool(
            _replay, hb.store, ns, key, hashlib.sha256(body).hexdigest()
        )
        if replay is None:
            raise
        return _json_response(replay[1], replay[0], {"Idempotent-Replayed": "true"})
    if not principal.is_admin:
        _refuse_raw_priority(sub.specs, sub.burst)
        sub = dataclasses.replace(sub, restricted=True)
    try:
        status, response, replayed = await asyncio.wrap_future(
            hb.writer.submit(sub)
        )
    except sa.exc.IntegrityError:
        # Another process (or a request in the same batch) stored the same key first: replay its answer.
        replay = None if key is None else await run_in_threadpool(_replay, hb.store, ns, key, sub.digest)
        if replay is None:
            raise
        status, response, replayed = replay[0], replay[1], True
    if not replayed:
        hb.metrics.submitted.labels(ns).inc(len(sub.specs))
    return _json_response(response, status, {"Idempotent-Replayed": "true"} if replayed else None)


MAX_LABEL_FILTERS = 16  # label= filters per job listing (issue 17)


@router.get("/v1/namespaces/{ns}/jobs", tags=["jobs"], response_model=None, responses=documented(JobListOut))
def list_jobs(
    ns: Annotated[str, Depends(require_namespace)],
    session: Annotated[Session, Depends(get_session)],
    state: Annotated[list[JobState] | None, Query(description="filter by state (repeatable)")] = None,
    label: Annotated[
        list[str] | None, Query(description="label selector key=value (repeatable, all must match)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=64, description="next_cursor of the previous page")] = None,
) -> dict[str, Any]:
    """Jobs of ``ns`` in submission order, ``limit`` per page; pass ``next_cursor`` to get the next page."""
    stmt = sa.select(_jobs).where(_jobs.c.namespace == ns)
    if state:
        stmt = stmt.where(_jobs.c.state.in_([s.value for s in state]))
    if len(label or []) > MAX_LABEL_FILTERS:  # each is a sub-query: bounded, so a tenant cannot pin a core
        raise SpecError("label", f"{len(label or [])} label filters; at most {MAX_LABEL_FILTERS} are allowed. "
                                 "To fix: select on fewer labels")
    for selector in label or []:
        k, sep, v = selector.partition("=")
        if not sep or not k:
            raise SpecError("label", f"{selector!r} is not key=value. To fix: pass e.g. label=team=ml")
        stmt = stmt.where(
            sa.exists().where(_labels.c.job_id == _jobs.c.id, _labels.c.key == k, _labels.c.value == v)
        )
    if cursor:
        stmt = stmt.where(_jobs.c.id > cursor)
    rows = list(session.execute(stmt.order_by(_jobs.c.id).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    labels: dict[str, dict[str, str]] = {}
    if rows:
        for job_id, k, v in session.execute(
            sa.select(_labels.c.job_id, _labels.c.key, _labels.c.value).where(
                _labels.c.job_id.in_([r.id for r in rows])
            )
        ):
            labels.setdefault(job_id, {})[k] = v
    return {
        "jobs": [job_summary(r, labels.get(r.id)) for r in rows],
        "next_cursor": rows[-1].id if more else None,
    }


def _get_row(session: Session, ns: str, job_id: str) -> Any:
    row = session.execute(sa.select(_jobs).where(_jobs.c.id == job_id, _jobs.c.namespace == ns)).first()
    if row is None:
        raise NotFoundError(f"job {job_id!r} not found in namespace {ns!r}. To fix: broker jobs list")
    return row


@router.get("/v1/namespaces/{ns}/jobs/{job_id}", tags=["jobs"], response_model=None,
            responses=documented(JobDetailOut))
def get_job(
    job_id: str,
    ns: Annotated[str, Depends(require_namespace)],
    session: Annotated[Session, Depends(get_session)],
) -> dict[str, Any]:
    """One job: spec, state, placement (OPTION object or null) with cost, instances, attempts, events."""
    return job_detail(session, _get_row(session, ns, job_id))


@router.delete("/v1/namespaces/{ns}/jobs/{job_id}", tags=["jobs"], response_model=None,
               responses=documented(JobDetailOut, 200, 409) | {202: {
                   "model": JobDetailOut, "description": "the cancel is recorded; the replica that runs the job "
                   "stops it (ask the job again: it ends CANCELLED)"}})
def cancel_job(
    job_id: str,
    ns: Annotated[str, Depends(require_namespace)],
    hb: Annotated[Any, Depends(get_state)],
) -> Response:
    """Cancel a job and stop whatever runs for it: 200 once stopped and CANCELLED, 202 while the replica that
    runs it has still to stop it. 409 when it already ended.

    202 comes from a replica that cannot stop the run itself (an on-prem run of another machine): the cancel is
    recorded and the job ends CANCELLED once that run is stopped; ask the job again.
    \f
    Protocol (:mod:`broker.job_logs`): a job with a run first gets ``cancel_requested_at`` (the leader's poll
    then leaves it alone, so the stop is not taken for a crash); a replica that can stop the run does so and
    only then marks the job CANCELLED; otherwise the leader, or the replica whose pool runs it, does.
    """
    from broker.job_logs import can_stop_here, instance_ids, stop_and_cancel
    from broker.lifecycle import note

    store: Store = hb.store
    now = hb.clock.now()
    with store.tx() as session:
        row = _get_row(session, ns, job_id)
        if JobState(row.state) in TERMINAL_STATES:
            raise ConflictError(f"job {job_id} already ended ({row.state}); nothing to cancel")
        ids = instance_ids(row.instances_json)
        has_run = bool(row.provider and ids)
        if not has_run:  # nothing runs for it (a launch in flight is the leader's to undo: reconcile, sweeper)
            transition(session, job_id, JobState.CANCELLED, now=now, reason="cancelled by user", finished_at=now)
        elif row.cancel_requested_at is None:
            session.execute(_jobs.update().where(_jobs.c.id == job_id).values(cancel_requested_at=now))
            note(session, job_id, JobState(row.state), "cancel requested by user", now=now)
    if not has_run:
        hb.metrics.transitions.labels(JobState.CANCELLED.value).inc()
    elif can_stop_here(hb.providers, row.provider, ids):
        stop_and_cancel(hb, job_id, reason="cancelled by user")
    with store.read() as session:
        out = job_detail(session, _get_row(session, ns, job_id))
    pending = out["state"] != JobState.CANCELLED.value
    return _json_response(out, 202 if pending else 200)


def _log_headers(source: str, **extra: Any) -> dict[str, str]:
    return {"X-Log-Source": source, **{f"X-Log-{k.replace('_', '-').title()}": str(v) for k, v in extra.items()}}


@router.get(
    "/v1/namespaces/{ns}/jobs/{job_id}/logs", tags=["jobs"], response_class=PlainTextResponse,
    responses=_ERRORS | {409: _ERR, 503: _ERR},
)
def job_logs(
    job_id: str,
    ns: Annotated[str, Depends(require_namespace)],
    session: Annotated[Session, Depends(get_session)],
    hb: Annotated[Any, Depends(get_state)],
    stream: Annotated[str, Query(pattern="^(stdout|stderr)$")] = "stdout",
    tail_bytes: Annotated[int, Query(ge=1, le=16 * 1024 * 1024)] = 1024 * 1024,
) -> Response:
    """The ``stdout`` (or ``stderr``) of the job's run, last ``tail_bytes`` bytes, from whichever replica has it.

    A cloud run: the log tail its VM reported when it ended (stdout and stderr together; 409 while it runs).
    An on-prem run: from this replica's data directory when it runs the job here, else the tail the replica
    running it stored (``X-Log-Source: stored``, at most 64 KiB, a few seconds behind while it runs). 503
    (``Retry-After``) while a run elsewhere has stored nothing yet, 404 when no log of the run is kept anywhere.
    \f
    ``X-Log-Source`` is ``local``, ``stored`` or ``provider`` (a cloud VM's tail, reported when it ends);
    a stored tail also has ``X-Log-Stored-At``, ``X-Log-Size`` (the stream's whole size) and ``X-Log-Ended``.
    """
    from broker.job_logs import instance_ids, read_tail, stored_tail

    row = _get_row(session, ns, job_id)
    ids = instance_ids(row.instances_json)
    # a cloud run: the log tail its VM reported with its exit code, from the job's final event (stdout and
    # stderr together, so ``stderr`` is empty); see docs/PROVIDERS.md
    if row.provider and row.provider != "onprem":
        tails = [_loads(d) or {} for d in session.execute(
            sa.select(_events.c.data_json).where(_events.c.job_id == row.id, _events.c.data_json.like(
                '%"log_tail"%')).order_by(_events.c.id.desc()).limit(1)).scalars()]
        if not tails and row.state not in {s.value for s in TERMINAL_STATES}:
            raise ConflictError(f"job {job_id} is {row.state} on {row.provider}: a cloud run's log tail is "
                                "reported when it ends; ask again then")
        text = str(tails[0].get("log_tail") or "") if tails and stream == "stdout" else ""
        return PlainTextResponse(text.encode()[-tail_bytes:].decode("utf-8", "ignore"),
                                 headers=_log_headers("provider"))
    stored = stored_tail(session, job_id, stream)
    if row.provider != "onprem" or not ids:
        if stored is None:
            raise ConflictError(
                f"job {job_id} has no on-prem run (state {row.state}, provider {row.provider or 'none'}); logs are "
                "kept only for on-prem and cloud runs"
            )
    else:
        pool = hb.providers.get("onprem")
        paths = None
        if pool is not None and hasattr(pool, "logs"):
            try:
                paths = pool.logs(ids[0])
            except NotFoundError:
                paths = None
        local = read_tail(paths[0] if stream == "stdout" else paths[1], tail_bytes) if paths else None
        if local is not None:
            return PlainTextResponse(local[0].decode("utf-8", "replace"), headers=_log_headers("local"))
    if stored is None:
        if row.state not in {s.value for s in TERMINAL_STATES}:
            return _json_response(
                {"detail": f"the logs of job {job_id} ({row.state}) are on the replica that runs it, which has "
                           "not stored a tail yet. To fix: ask again in a few seconds"},
                503, {"Retry-After": "2"})
        raise NotFoundError(f"no log of job {job_id}'s run is kept: its on-prem run ended on another replica "
                            "without storing a tail (or its data directory is gone)")
    return PlainTextResponse(stored.data[-tail_bytes:].decode("utf-8", "replace"), headers=_log_headers(
        "stored", stored_at=stored.stored_at.isoformat(), size=stored.size_bytes, ended=str(stored.ended).lower()))


# ------------------------------------------------------------------------------------------ queues


class QueueIn(BaseModel):
    """A queue setting: ``discipline`` (default | fifo | priority | fair-share | edf), a namespace's
    fair-share ``weight`` (>= 0; 0 = only leftovers), the cluster's ``halfLifeSeconds`` of usage decay.
    Fields left out keep their value."""

    discipline: str | None = Field(default=None, max_length=16)
    weight: float | None = Field(default=None, ge=0, le=1e6, allow_inf_nan=False)
    halfLifeSeconds: float | None = Field(default=None, ge=0, le=1e10, allow_inf_nan=False)  # noqa: N815


@router.get("/v1/namespaces/{ns}/queue", tags=["queues"], responses=_ERRORS)
def get_queue(
    ns: Annotated[str, Depends(require_namespace)],
    session: Annotated[Session, Depends(get_session)],
    hb: Annotated[Any, Depends(get_state)],
) -> dict[str, Any]:
    """The queue of ``ns``: discipline, fair-share weight, decayed usage and dominant share."""
    from broker.queues import queue_status

    return queue_status(session, ns, hb.clock.now())


@router.put("/v1/namespaces/{ns}/queue", tags=["queues"], responses=_ERRORS | {403: _ERR})
def put_queue(
    body: QueueIn,
    ns: Annotated[str, Depends(require_namespace)],
    _admin: Annotated[Principal, Depends(require_admin)],
    hb: Annotated[Any, Depends(get_state)],
) -> dict[str, Any]:
    """Set the discipline and/or fair-share weight of ``ns`` (admin). 422 for an unknown discipline."""
    from broker.queues import queue_status, set_queue

    now = hb.clock.now()
    with hb.store.tx() as session:
        set_queue(session, ns, now=now, discipline=body.discipline, weight=body.weight,
                  half_life_seconds=body.halfLifeSeconds)
    with hb.store.read() as session:
        return queue_status(session, ns, now)


def _cluster_queue(session: Session) -> dict[str, Any]:
    from broker.queues import load_queue_config

    config = load_queue_config(session)
    return {"discipline": config.default_discipline, "halfLifeSeconds": config.half_life_seconds,
            "namespaces": {ns: {"discipline": d, "weight": config.weights.get(ns, 1.0)}
                           for ns, d in sorted(config.disciplines.items())}}


@router.get("/v1/queue", tags=["queues"], responses=_ERRORS | {403: _ERR})
def get_cluster_queue(
    _admin: Annotated[Principal, Depends(require_admin)],
    session: Annotated[Session, Depends(get_session)],
) -> dict[str, Any]:
    """The cluster discipline (how namespaces are merged), the half-life, and every namespace setting."""
    return _cluster_queue(session)


@router.put("/v1/queue", tags=["queues"], responses=_ERRORS | {403: _ERR})
def put_cluster_queue(
    body: QueueIn,
    _admin: Annotated[Principal, Depends(require_admin)],
    hb: Annotated[Any, Depends(get_state)],
) -> dict[str, Any]:
    """Set the cluster discipline and/or fair-share half-life (admin). ``weight`` is per namespace: 422."""
    from broker.queues import CLUSTER, set_queue

    if body.weight is not None:
        raise SpecError("weight", "a weight belongs to a namespace. To fix: PUT /v1/namespaces/{ns}/queue")
    with hb.store.tx() as session:
        set_queue(session, CLUSTER, now=hb.clock.now(), discipline=body.discipline,
                  half_life_seconds=body.halfLifeSeconds)
    with hb.store.read() as session:
        return _cluster_queue(session)


# ------------------------------------------------------------------------------------------ placement


@router.post("/v1/placements:preview", tags=["placement"], openapi_extra=JOB_BODY,
             responses=documented(PreviewOut))
async def preview(
    request: Request,
    principal: Annotated[Principal, Depends(current_principal)],
    hb: Annotated[Any, Depends(get_state)],
) -> JSONResponse:
    """Where one job spec would run and what it would cost, with the explanation (the JSON of
    ``broker place --json``). Nothing is submitted."""
    body = await read_body(request)
    content_type = request.headers.get("content-type", "").lower()
    result = await run_in_threadpool(_preview_sync, hb, principal, body, content_type)
    return JSONResponse(result)


def _preview_sync(hb: Any, principal: Principal, body: bytes, content_type: str) -> dict[str, Any]:
    from broker.spec import parse_job_spec

    payload = _parse_payload(body, content_type)
    if not isinstance(payload, dict):
        raise SpecError("", "a preview takes one job spec (a mapping), not a list")
    now = hb.clock.now()
    spec = parse_job_spec(payload, now=now)
    result = hb.place(spec.request, now=now, extra_offers=hb.visible_offers(principal.namespace))
    try:
        from broker import decisions

        with hb.store.tx() as session:
            decisions.record_decision(
                session, job_id=None, namespace=principal.namespace, request=spec.request, result=result,
                policy="cost", catalog_version=hb.catalog_version, now=now, kind="preview",
            )
    except ImportError:
        pass
    return {**result.to_dict(), "explanation": result.explanation}


@router.get("/v1/catalog/offers", tags=["placement"], response_model=None, responses=documented(OffersOut))
def catalog_offers(
    principal: Annotated[Principal, Depends(current_principal)],
    hb: Annotated[Any, Depends(get_state)],
    provider: Annotated[str | None, Query(max_length=32)] = None,
    region: Annotated[str | None, Query(max_length=64)] = None,
    min_vcpus: Annotated[float, Query(ge=0, le=1e6)] = 0,
    min_memory_gib: Annotated[float, Query(ge=0, le=1e9)] = 0,
    min_gpus: Annotated[int, Query(ge=0, le=1024)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=100_000)] = 0,
) -> dict[str, Any]:
    """Offers of the catalog (and the on-prem pool), cheapest first, filtered; ``limit``/``offset`` pages."""
    offers, total = hb.offers_matching(provider, region, min_vcpus, min_memory_gib, min_gpus, offset + limit,
                                       namespace=principal.namespace)  # a namespace token: its own devices only
    page = offers[offset : offset + limit]
    return {
        "catalog_version": hb.catalog_version,
        "total": total,
        "offers": [
            {
                "provider": o.location.provider,
                "region": o.location.region,
                "zone": o.location.zone,
                "site": str(o.location.site),
                "instance_type": o.instance_type.name,
                "vcpus": o.instance_type.vcpus,
                "memory_gib": o.instance_type.memory_gib,
                "gpus": o.instance_type.gpus,
                "accelerator": o.instance_type.accelerator,
                "arch": o.instance_type.arch,
                "capacity": str(o.capacity),
                "hourly_usd": o.hourly_usd,
            }
            for o in page
        ],
    }
