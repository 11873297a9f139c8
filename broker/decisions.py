"""Decision records: what the broker chose for each placement (and preview), and why.

Every placement the scheduler makes and every ``POST /v1/placements:preview`` stores one
:class:`DecisionRecord`: the request (resources, data inputs, constraints), the chosen option and
the ranked alternatives with their full cost breakdown (compute, egress, transfer hours, capacity
kind, site), the rejection counts by reason, the policy, and the catalog version whose prices were
used. When the run finishes, :func:`record_outcome` adds the actual runtime and cost.

History is never re-priced: the reports (``broker.reports``) read the prices stored in each record.

Design choice: a few values the reports aggregate over (provider, region, capacity, totals) are
copied into plain columns beside the JSON so that filters and sums do not need to parse JSON; the
JSON columns stay the complete truth.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from sqlalchemy import JSON, Column, DateTime, String, bindparam, insert
from sqlalchemy import select as sa_select
from sqlmodel import Field, Session, SQLModel, col, select

from broker.model import PlacementOption, PlacementResult, Request

__all__ = [
    "DecisionRecord",
    "JsonMemo",
    "KINDS",
    "record_decision",
    "record_decisions",
    "record_outcome",
    "record_outcomes",
    "query_decisions",
    "request_to_dict",
    "option_to_dict",
    "as_utc",
]

KINDS = ("placement", "preview")


class DecisionRecord(SQLModel, table=True):
    """One placement decision. Money is USD for the whole job (all nodes); times are UTC.

    ``chosen`` is ``None`` when nothing was feasible. ``alternatives`` are the ranked options the
    placement returned (each a full :class:`~broker.model.PlacementOption` dict, including ``site``
    and ``finish_hours``). ``rejected`` maps a reason constant to the number of offers it removed.
    The ``runtime_hours``/``actual_cost_usd``/``finished_at``/``deadline_met`` columns stay ``None``
    until :func:`record_outcome` is called for the job.
    """

    __tablename__ = "decision_records"

    id: int | None = Field(default=None, primary_key=True)
    job_id: str | None = Field(default=None, index=True, max_length=128)
    namespace: str | None = Field(default=None, index=True, max_length=128)
    kind: str = Field(default="placement", max_length=16)
    job_name: str = Field(default="", max_length=256)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False, index=True))
    request: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    chosen: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    alternatives: list[dict[str, Any]] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    rejected: dict[str, int] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    constraints: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    considered: int = 0
    feasible: int = 0
    policy: str = Field(default="", max_length=64)
    catalog_version: str = Field(default="", max_length=128)
    explanation: str = ""
    # what the report's savings baselines need, priced at decision time (policies/placement/baselines.py)
    baselines: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    # denormalised from `chosen` for filters and sums (None when nothing was feasible)
    provider: str | None = Field(default=None, max_length=32)
    region: str | None = Field(default=None, max_length=64)
    capacity: str | None = Field(default=None, max_length=16)
    total_usd: float | None = None
    nodes: int = 1
    # deadline: the request's deadline and the predicted finish (created_at + finish hours)
    deadline: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True), nullable=True))
    predicted_finish_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    # outcome, filled by record_outcome when the run finished
    runtime_hours: float | None = None
    actual_cost_usd: float | None = None
    finished_at: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True), nullable=True))
    deadline_met: bool | None = None


def as_utc(value: datetime | None) -> datetime | None:
    """``value`` as timezone-aware UTC; a naive value (SQLite returns those) is taken to be UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


_PLAIN = frozenset({str, int, float, bool, type(None)})  # exact types: an Enum subclassing str is not plain


@functools.lru_cache(maxsize=64)
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _jsonable(value: Any) -> Any:
    if type(value) in _PLAIN:  # most values (option fields): returned as they are, without the checks below
        return value
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return as_utc(value).isoformat()  # type: ignore[union-attr]
    if isinstance(value, tuple | list):
        return [v if type(v) in _PLAIN else _jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for name in _field_names(type(value)):  # plain fields copied without a call per field
            v = getattr(value, name)
            out[name] = v if type(v) in _PLAIN else _jsonable(v)
        return out
    if isinstance(value, dict):
        return {str(k): v if type(v) in _PLAIN else _jsonable(v) for k, v in value.items()}
    return value


class JsonMemo:
    """The JSON values of objects many decision records share, kept across calls of :func:`record_decisions`
    (the scheduler keeps placements across cycles, so their options, alternatives and baselines recur in
    every cycle's records). Keyed by identity; each entry holds its object, so an id is not reused while it
    lives; the least recently used go past ``size`` entries. The values are shared: never mutate them."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._hits: OrderedDict[int, tuple[Any, Any]] = OrderedDict()
        self._texts: JsonMemo | None = None
        self._lock = threading.Lock()  # launch threads share the scheduler's option memo

    @property
    def texts(self) -> JsonMemo:
        """A memo of the stored (encoded) form of this memo's values, keyed by those values."""
        if self._texts is None:
            self._texts = JsonMemo(self.size)
        return self._texts

    def get(self, obj: Any, convert: Callable[[Any], Any]) -> Any:
        key = id(obj)
        with self._lock:
            hit = self._hits.get(key)
            if hit is not None and hit[0] is obj:
                self._hits.move_to_end(key)
                return hit[1]
        value = convert(obj)
        with self._lock:
            self._hits[key] = (obj, value)
            if len(self._hits) > self.size:
                self._hits.popitem(last=False)
        return value


def request_to_dict(request: Request) -> dict[str, Any]:
    """Every field of ``request`` as JSON-ready values (enums as strings, deadline as ISO UTC,
    data inputs as ``{uri, location, size_gib}`` dicts)."""
    out = _jsonable(request)
    assert isinstance(out, dict)
    return out


def option_to_dict(option: PlacementOption) -> dict[str, Any]:
    """Every field of ``option`` (the public contract keys plus ``site`` and ``finish_hours``)."""
    out = _jsonable(option)
    assert isinstance(out, dict)
    return out


def _finish_hours(option: PlacementOption, request: Request) -> float:
    if option.finish_hours > 0:
        return option.finish_hours
    return option.transfer_hours + request.duration_hours


def _decision_row(
    *,
    job_id: str | None,
    namespace: str | None,
    request: Request,
    result: PlacementResult,
    policy: str,
    catalog_version: str,
    now: datetime,
    kind: str,
    memo: JsonMemo | None = None,
) -> dict[str, Any]:
    """The column values of one decision record (shared by the single and the bulk writer). ``memo`` (the
    bulk writer's) reuses the JSON values of options, alternatives and baselines shared by several records
    (placements are cached per request, so most jobs of a burst, and of later cycles, share them)."""

    def once(obj: Any, convert: Any) -> Any:
        return convert(obj) if memo is None else memo.get(obj, convert)

    if kind not in KINDS:
        raise ValueError(f"decision kind {kind!r} is not one of {', '.join(KINDS)}. To fix: pass kind='placement'")
    created = as_utc(now)
    assert created is not None
    chosen = result.placement
    constraints = {
        "providers": list(request.providers),
        "regions": list(request.regions),
        "spot": _jsonable(request.spot),
        "max_hourly_usd": request.max_hourly_usd,
        "deadline": _jsonable(request.deadline),
        "objective": _jsonable(request.objective),
        "arch": request.arch,
        "accelerator": request.accelerator,
        "nodes": request.nodes,
        "same_zone": request.same_zone,
    }
    return dict(
        job_id=job_id,
        namespace=namespace,
        kind=kind,
        job_name=request.name or result.job,
        created_at=created,
        request=request_to_dict(request),
        chosen=None if chosen is None else once(chosen, option_to_dict),
        alternatives=once(result.alternatives, lambda alts: [option_to_dict(a) for a in alts]),
        rejected={str(k): int(v) for k, v in result.rejected.items()},
        constraints=constraints,
        considered=result.considered,
        feasible=result.feasible,
        policy=policy,
        catalog_version=catalog_version or result.catalog_version,
        explanation=result.explanation,
        baselines=once(result.baselines, lambda b: _jsonable(dict(b))) if result.baselines else None,
        provider=None if chosen is None else chosen.provider,
        region=None if chosen is None else chosen.region,
        capacity=None if chosen is None else chosen.capacity,
        total_usd=None if chosen is None else chosen.total_usd,
        nodes=request.nodes,
        deadline=as_utc(request.deadline),
        predicted_finish_at=(
            None if chosen is None else created + timedelta(hours=_finish_hours(chosen, request))
        ),
    )


def record_decision(
    session: Session,
    *,
    job_id: str | None,
    namespace: str | None,
    request: Request,
    result: PlacementResult,
    policy: str,
    catalog_version: str,
    now: datetime,
    kind: str = "placement",
) -> int:
    """Add the decision record of ``result`` to ``session`` and return its id.

    The caller owns the transaction: the row is flushed (so the id exists) but not committed,
    so it commits or rolls back together with the PLACED transition. ``catalog_version`` is
    the version whose prices ``result`` used (``result.catalog_version`` when empty).
    ``now`` must be timezone-aware (naive is taken as UTC). ``kind`` is ``placement`` or ``preview``.
    Raises ``ValueError`` for an unknown kind.
    """
    record = DecisionRecord(**_decision_row(
        job_id=job_id, namespace=namespace, request=request, result=result, policy=policy,
        catalog_version=catalog_version, now=now, kind=kind,
    ))
    session.add(record)
    session.flush()
    assert record.id is not None
    return record.id


def record_decisions(session: Session, decisions: Sequence[Mapping[str, Any]], *,
                     memo: JsonMemo | None = None) -> int:
    """Add many decision records in one statement (the scheduler's path: one executemany per cycle
    instead of one ORM flush per job). Each item takes the keyword arguments of :func:`record_decision`.
    ``memo`` keeps the JSON values of shared objects across calls (default: for this call only).
    Like it, this never commits. Returns how many rows were added."""
    memo = JsonMemo() if memo is None else memo
    rows = [_decision_row(**dict(d), memo=memo) for d in decisions]
    if not rows:
        return 0
    dialect = session.connection().dialect
    if dialect.name != "sqlite":
        session.execute(insert(DecisionRecord), rows)
        return len(rows)
    # SQLite stores JSON as text: encode each JSON value with the column type's own processor (the same text
    # the insert above would store), and the values shared by many records (options, alternatives,
    # baselines) only once: the memo keeps their text beside them.
    table = DecisionRecord.__table__  # type: ignore[attr-defined]
    encode = {c: table.c[c].type.dialect_impl(dialect).bind_processor(dialect) or (lambda v: v)
              for c in _JSON_COLUMNS}
    texts = memo.texts
    for row in rows:
        for c in _JSON_COLUMNS:
            value = row.pop(c)
            row[f"json_{c}"] = texts.get(value, encode[c]) if c in _SHARED_JSON else encode[c](value)
    session.execute(_encoded_insert(), rows)
    return len(rows)


_JSON_COLUMNS = ("request", "chosen", "alternatives", "rejected", "constraints", "baselines")
_SHARED_JSON = frozenset({"chosen", "alternatives", "baselines"})  # values of the memo, shared by records


@functools.lru_cache(maxsize=1)
def _encoded_insert() -> Any:
    """The insert of :func:`record_decisions` taking the JSON columns as already-encoded text."""
    table = DecisionRecord.__table__  # type: ignore[attr-defined]
    return table.insert().values({c: bindparam(f"json_{c}", type_=String()) for c in _JSON_COLUMNS})


def _outcome(chosen: Mapping[str, Any], nodes: int, deadline: datetime | None, runtime_hours: float,
             finished_at: datetime) -> dict[str, Any]:
    """The outcome columns of one placement record (:func:`record_outcome` and :func:`record_outcomes`):
    ``actual_cost_usd = hourly_usd * nodes * runtime_hours + egress_usd`` (the egress was paid when the data
    moved), ``deadline_met`` when the request had a deadline."""
    finished, due = as_utc(finished_at), as_utc(deadline)
    return {"runtime_hours": float(runtime_hours), "finished_at": finished,
            "actual_cost_usd": float(chosen.get("hourly_usd", 0.0)) * max(1, nodes) * float(runtime_hours)
            + float(chosen.get("egress_usd", 0.0)),
            "deadline_met": None if due is None or finished is None else finished <= due}


def record_outcome(
    session: Session, job_id: str, runtime_hours: float, finished_at: datetime
) -> DecisionRecord | None:
    """Store the actual runtime of ``job_id``'s run on its latest placement record.

    ``actual_cost_usd = hourly_usd * nodes * runtime_hours + egress_usd`` (the egress was paid
    when the data moved). ``deadline_met`` is set when the request had a deadline. Returns the
    updated record (added to the session, not committed), or ``None`` when the job has no
    placement record (e.g. it was placed before records existed). Raises ``ValueError`` for a
    negative runtime.
    """
    if runtime_hours < 0:
        raise ValueError(f"runtime_hours must be >= 0, got {runtime_hours}")
    stmt = (
        select(DecisionRecord)
        .where(DecisionRecord.job_id == job_id, DecisionRecord.kind == "placement")
        .where(col(DecisionRecord.chosen).is_not(None))
        .order_by(col(DecisionRecord.created_at).desc(), col(DecisionRecord.id).desc())
        .limit(1)
    )
    record = session.exec(stmt).first()
    if record is None or record.chosen is None:
        return None
    for key, value in _outcome(record.chosen, record.nodes, record.deadline, runtime_hours, finished_at).items():
        setattr(record, key, value)
    session.add(record)
    session.flush()
    return record


def record_outcomes(session: Session, outcomes: Sequence[tuple[str, float]], finished_at: datetime) -> int:
    """:func:`record_outcome` for many jobs that finished at ``finished_at`` (the scheduler's path: one read
    of their latest placement records and one executemany update instead of a query and a flush per job).
    ``outcomes`` are ``(job_id, runtime_hours)``; the values written are those of :func:`record_outcome`.
    Never commits; returns how many records were updated. Raises ``ValueError`` for a negative runtime."""
    hours_of: dict[str, float] = {}
    for job_id, runtime_hours in outcomes:
        if runtime_hours < 0:
            raise ValueError(f"runtime_hours must be >= 0, got {runtime_hours}")
        hours_of[job_id] = float(runtime_hours)
    if not hours_of:
        return 0
    t = DecisionRecord.__table__  # type: ignore[attr-defined]
    latest: dict[str, Any] = {}
    ids = list(hours_of)
    for start in range(0, len(ids), 900):  # under SQLite's bound-parameter limit
        stmt = (
            sa_select(t.c.id, t.c.job_id, t.c.chosen, t.c.nodes, t.c.deadline)
            .where(t.c.job_id.in_(ids[start:start + 900]), t.c.kind == "placement", t.c.chosen.is_not(None))
            .order_by(t.c.job_id, t.c.created_at, t.c.id)
        )
        for row in session.execute(stmt):
            latest[row.job_id] = row  # ascending: the last one per job is its latest record
    values = [{"b_id": row.id, **_outcome(row.chosen, row.nodes, row.deadline, hours_of[job_id], finished_at)}
              for job_id, row in latest.items() if row.chosen is not None]  # None: a JSON null
    if values:  # one Core executemany by primary key (the ORM's bulk update runs its own bookkeeping per row)
        session.execute(_outcome_update(), values)
    return len(values)


@functools.lru_cache(maxsize=1)
def _outcome_update() -> Any:
    t = DecisionRecord.__table__  # type: ignore[attr-defined]
    return t.update().where(t.c.id == bindparam("b_id"))


def query_decisions(
    session: Session,
    namespace: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    kinds: Sequence[str] = KINDS,
) -> list[DecisionRecord]:
    """Decision records with ``since <= created_at < until`` (either bound ``None`` = open), of
    ``namespace`` (``None`` = all namespaces), oldest first (ties by id)."""
    stmt = select(DecisionRecord)
    if namespace is not None:
        stmt = stmt.where(DecisionRecord.namespace == namespace)
    since_at, until_at = as_utc(since), as_utc(until)
    if since_at is not None:
        stmt = stmt.where(col(DecisionRecord.created_at) >= since_at)
    if until_at is not None:
        stmt = stmt.where(col(DecisionRecord.created_at) < until_at)
    if tuple(kinds) != KINDS:
        stmt = stmt.where(col(DecisionRecord.kind).in_(list(kinds)))
    stmt = stmt.order_by(col(DecisionRecord.created_at), col(DecisionRecord.id))
    return list(session.exec(stmt).all())
