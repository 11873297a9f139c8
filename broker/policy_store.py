"""Policy documents in the store (quotas, priority classes, budgets, reservations), the spend ledger, and
the admission check that enforces them in the scheduler.

Documents are applied like ``kubectl apply``: by kind and name (and namespace), create or replace.
:func:`apply_document` validates with the pure parsers of :mod:`policies` and adds rows to the caller's
session (the caller commits). :func:`load_snapshot` reads everything admission needs into a
:class:`policies.admission.PolicySnapshot`. :class:`PolicyAdmission` is the scheduler's admission hook.

Spend (what budgets count) is the ledger table plus the priced estimate (``placement_json.total_usd``)
of every job that was placed, dated when it was placed (``started_at``, else ``updated_at``); a ledger
row with ``kind="actual"`` and a negative/positive correction adjusts it when a run's real cost is known.
**Dry-run** jobs (``jobs.dry_run``: the provider only simulated them) never count against a budget: their
estimate and their ledger rows (``kind="dry-run"``) are *simulated spend*, read with
``spend_entries(..., dry_run=True)`` and shown apart in :func:`budget_burn` (``dry_run_today_usd``,
``dry_run_month_usd``), as the placement report shows them apart.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, Session, SQLModel, select

from broker.errors import SpecError
from broker.store import JobRow, utc, utc_column
from policies import budget as budget_mod
from policies import priority as priority_mod
from policies import quota as quota_mod
from policies.admission import ADMISSION_CHECKS, Check, PolicySnapshot, admit, with_resolved_priority
from policies.budget import Budget, Burn, SpendEntry
from policies.priority import PriorityClass
from policies.quota import ResourceQuota
from policies.reservations import Reservation
from policies.workload import GPU, Resources, Workload, parse_cpu, parse_memory_gib

__all__ = [
    "QuotaRecord",
    "PriorityClassRecord",
    "AllowedPriorityClassesRecord",
    "BudgetRecord",
    "ReservationRecord",
    "SpendRecord",
    "Applied",
    "KINDS",
    "apply_document",
    "apply_documents",
    "delete_document",
    "list_quotas",
    "list_priority_classes",
    "allowed_priority_classes",
    "set_allowed_priority_classes",
    "list_budgets",
    "list_reservations",
    "record_spend",
    "record_spends",
    "DRY_RUN_KIND",
    "spend_entries",
    "budget_burn",
    "active_workloads",
    "workload_from_row",
    "load_snapshot",
    "resolve_priority",
    "PolicyAdmission",
]

KINDS = ("ResourceQuota", "PriorityClass", "Budget", "Reservation", priority_mod.ALLOWED_KIND)
_ACTIVE = ("PLACED", "PROVISIONING", "RUNNING")


class QuotaRecord(SQLModel, table=True):
    """A ResourceQuota: ``hard``/``borrowing_limit`` in canonical keys and base units (cores, GiB, counts)."""

    __tablename__ = "policy_quotas"
    namespace: str = Field(sa_column=sa.Column(sa.String(63), primary_key=True))
    name: str = Field(sa_column=sa.Column(sa.String(253), primary_key=True))
    hard: dict[str, float] = Field(default_factory=dict, sa_column=sa.Column(sa.JSON, nullable=False))
    cohort: str | None = Field(default=None, sa_column=sa.Column(sa.String(253), index=True))
    borrowing_limit: dict[str, float] = Field(default_factory=dict, sa_column=sa.Column(sa.JSON, nullable=False))
    document: dict[str, Any] = Field(default_factory=dict, sa_column=sa.Column(sa.JSON, nullable=False))
    updated_at: datetime = utc_column()


class PriorityClassRecord(SQLModel, table=True):
    __tablename__ = "policy_priority_classes"
    name: str = Field(sa_column=sa.Column(sa.String(253), primary_key=True))
    value: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    preemption_policy: str = Field(sa_column=sa.Column(sa.String(32), nullable=False))
    global_default: bool = Field(default=False, sa_column=sa.Column(sa.Boolean, nullable=False))
    description: str = Field(default="", sa_column=sa.Column(sa.Text, nullable=False))
    updated_at: datetime = utc_column()


class AllowedPriorityClassesRecord(SQLModel, table=True):
    """The PriorityClasses the tokens of ``namespace`` may name (``names``, a JSON list); no row: the default
    of :func:`policies.priority.usable_classes` (classes at or below the default priority)."""

    __tablename__ = "policy_allowed_priority_classes"
    namespace: str = Field(sa_column=sa.Column(sa.String(63), primary_key=True))
    names: list[str] = Field(default_factory=list, sa_column=sa.Column(sa.JSON, nullable=False))
    updated_at: datetime = utc_column()


class BudgetRecord(SQLModel, table=True):
    __tablename__ = "policy_budgets"
    namespace: str = Field(sa_column=sa.Column(sa.String(63), primary_key=True))
    name: str = Field(sa_column=sa.Column(sa.String(253), primary_key=True))
    daily_usd: float | None = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    monthly_usd: float | None = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    enforcement: str = Field(sa_column=sa.Column(sa.String(8), nullable=False))
    updated_at: datetime = utc_column()


class ReservationRecord(SQLModel, table=True):
    __tablename__ = "policy_reservations"
    name: str = Field(sa_column=sa.Column(sa.String(253), primary_key=True))
    pool: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    cpu: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False))
    memory_gib: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False))
    gpus: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False))
    priority_class: str | None = Field(default=None, sa_column=sa.Column(sa.String(253)))
    namespace: str | None = Field(default=None, sa_column=sa.Column(sa.String(63)))
    updated_at: datetime = utc_column()


class SpendRecord(SQLModel, table=True):
    """A ledger row: ``usd`` charged to ``namespace`` at ``at`` (``kind``: ``actual``, ``adjustment``...)."""

    __tablename__ = "policy_spend"
    id: int | None = Field(default=None, sa_column=sa.Column(sa.Integer, primary_key=True, autoincrement=True))
    namespace: str = Field(sa_column=sa.Column(sa.String(63), nullable=False, index=True))
    job_id: str = Field(default="", sa_column=sa.Column(sa.String(40), nullable=False, default=""))
    usd: float = Field(sa_column=sa.Column(sa.Float, nullable=False))
    kind: str = Field(default="adjustment", sa_column=sa.Column(sa.String(16), nullable=False))
    at: datetime = utc_column(index=True)


@dataclass(frozen=True, slots=True)
class Applied:
    """What :func:`apply_document` did: ``action`` is ``created``, ``configured`` or ``unchanged``."""

    kind: str
    name: str
    namespace: str | None
    action: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "namespace": self.namespace, "action": self.action}


def _reservation(doc: Mapping[str, Any]) -> Reservation:
    meta = doc.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise SpecError("metadata.name", "a Reservation needs a name")
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError("spec", "a Reservation needs spec.pool and spec.resources")
    pool = spec.get("pool")
    if not isinstance(pool, str) or not pool:
        raise SpecError("spec.pool", "the on-prem host or site to reserve on, e.g. localhost")
    res = spec.get("resources") or {}
    if not isinstance(res, Mapping) or not res:
        raise SpecError("spec.resources", "what to reserve, e.g. {cpu: '8', memory: 32Gi}")
    unknown = sorted(set(res) - {"cpu", "memory", GPU})
    if unknown:
        raise SpecError(f"spec.resources.{unknown[0]}", "unknown resource. To fix: use cpu, memory, nvidia.com/gpu")
    resources = Resources(
        parse_cpu(res.get("cpu", 0), field_name="spec.resources.cpu"),
        parse_memory_gib(res["memory"], field_name="spec.resources.memory") if "memory" in res else 0.0,
        parse_cpu(res.get(GPU, 0), field_name=f"spec.resources.{GPU}"),
    )
    pc, ns = spec.get("priorityClassName"), spec.get("namespace")
    if not pc and not ns:
        raise SpecError("spec", "name who may use it: spec.priorityClassName and/or spec.namespace")
    return Reservation(name, pool, resources, str(pc) if pc else None, str(ns) if ns else None)


def _upsert(session: Session, model: type[SQLModel], key: tuple[Any, ...], values: Mapping[str, Any]) -> str:
    row = session.get(model, key if len(key) > 1 else key[0])
    if row is None:
        session.add(model(**values))
        return "created"
    changed = any(getattr(row, k) != v for k, v in values.items() if k != "updated_at")
    if changed:
        for k, v in values.items():
            setattr(row, k, v)
        session.add(row)
    return "configured" if changed else "unchanged"


def apply_document(
    session: Session, doc: Mapping[str, Any], *, now: datetime | None = None, namespace: str | None = None
) -> Applied:
    """Validate and create-or-replace one policy document (no commit: the caller commits).

    Raises :class:`SpecError` (field path) for an invalid document or unknown ``kind``, and
    :class:`~broker.errors.ConflictError` when a second PriorityClass would be ``globalDefault``."""
    if not isinstance(doc, Mapping):
        raise SpecError("document", "expected a mapping (one YAML/JSON document)")
    now = now or datetime.now(UTC)
    kind = doc.get("kind")
    if kind == "ResourceQuota":
        q = quota_mod.parse_resource_quota(doc, namespace=namespace)
        action = _upsert(session, QuotaRecord, (q.namespace, q.name), {
            "namespace": q.namespace, "name": q.name, "hard": dict(q.hard), "cohort": q.cohort,
            "borrowing_limit": dict(q.borrowing_limit), "document": dict(doc), "updated_at": now})
        return Applied(kind, q.name, q.namespace, action)
    if kind == "PriorityClass":
        pc = priority_mod.parse_priority_class(doc)
        others = [c for c in list_priority_classes(session).values() if c.name != pc.name]
        priority_mod.check_single_global_default([*others, pc])
        action = _upsert(session, PriorityClassRecord, (pc.name,), {
            "name": pc.name, "value": pc.value, "preemption_policy": pc.preemption_policy,
            "global_default": pc.global_default, "description": pc.description, "updated_at": now})
        return Applied(kind, pc.name, None, action)
    if kind == priority_mod.ALLOWED_KIND:
        ns, names = priority_mod.parse_allowed_classes(doc, namespace=namespace)
        from broker.tenants import namespace_exists

        if not namespace_exists(session, ns):
            raise SpecError("metadata.namespace", f"namespace {ns!r} does not exist. To fix: broker namespaces "
                            f"create {ns}, or correct the name")
        return Applied(kind, ns, ns, set_allowed_priority_classes(session, ns, names, now=now))
    if kind == "Budget":
        b = budget_mod.parse_budget(doc, namespace=namespace)
        action = _upsert(session, BudgetRecord, (b.namespace, b.name), {
            "namespace": b.namespace, "name": b.name, "daily_usd": b.daily_usd, "monthly_usd": b.monthly_usd,
            "enforcement": b.enforcement, "updated_at": now})
        return Applied(kind, b.name, b.namespace, action)
    if kind == "Reservation":
        r = _reservation(doc)
        action = _upsert(session, ReservationRecord, (r.name,), {
            "name": r.name, "pool": r.pool, "cpu": r.resources.cpu, "memory_gib": r.resources.memory_gib,
            "gpus": r.resources.gpus, "priority_class": r.priority_class, "namespace": r.namespace,
            "updated_at": now})
        return Applied(kind, r.name, None, action)
    raise SpecError("kind", f"{kind!r} is not a policy document. To fix: use one of {', '.join(KINDS)}")


def apply_documents(
    session: Session, docs: Iterable[Mapping[str, Any]], *, now: datetime | None = None
) -> list[Applied]:
    """Apply several documents in order (all or nothing when the caller commits once). A SpecError names
    the document: ``items[2].spec.hard...``."""
    out = []
    for i, doc in enumerate(docs):
        try:
            out.append(apply_document(session, doc, now=now))
            session.flush()
        except SpecError as exc:
            raise SpecError(f"items[{i}].{exc.field}" if exc.field else f"items[{i}]", exc.message) from None
    return out


def delete_document(session: Session, kind: str, name: str, namespace: str | None = None) -> bool:
    """Delete one policy document; False when it did not exist."""
    model: dict[str, type[SQLModel]] = {"ResourceQuota": QuotaRecord, "PriorityClass": PriorityClassRecord,
                                        "Budget": BudgetRecord, "Reservation": ReservationRecord,
                                        priority_mod.ALLOWED_KIND: AllowedPriorityClassesRecord}
    if kind not in model:
        raise SpecError("kind", f"{kind!r} is not a policy kind. To fix: use one of {', '.join(KINDS)}")
    key: Any = (namespace, name) if kind in ("ResourceQuota", "Budget") else name
    if kind == priority_mod.ALLOWED_KIND:  # one per namespace: the name is the namespace (or its document's name)
        key = namespace or name
    row = session.get(model[kind], key)
    if row is None:
        return False
    session.delete(row)
    return True


def list_quotas(session: Session, namespace: str | None = None) -> list[ResourceQuota]:
    stmt = select(QuotaRecord)
    if namespace is not None:
        stmt = stmt.where(QuotaRecord.namespace == namespace)  # type: ignore[arg-type]
    return [ResourceQuota(r.name, r.namespace, dict(r.hard), r.cohort, dict(r.borrowing_limit or {}))
            for r in session.exec(stmt).all()]


def list_priority_classes(session: Session) -> dict[str, PriorityClass]:
    return {r.name: PriorityClass(r.name, r.value, r.preemption_policy, r.global_default, r.description)
            for r in session.exec(select(PriorityClassRecord)).all()}


def allowed_priority_classes(session: Session, namespaces: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
    """The allow-list of each namespace that has one (all, or those of ``namespaces``); a namespace missing
    from the answer has none (the default rule of :func:`policies.priority.usable_classes`)."""
    t = AllowedPriorityClassesRecord.__table__  # type: ignore[attr-defined]
    stmt = sa.select(t.c.namespace, t.c.names)
    if namespaces is not None:
        stmt = stmt.where(t.c.namespace.in_(sorted(set(namespaces))))
    return {r.namespace: tuple(r.names or ()) for r in session.execute(stmt)}


def set_allowed_priority_classes(
    session: Session, namespace: str, names: Iterable[str] | None, *, now: datetime | None = None
) -> str:
    """Set (``names``) or remove (``None``: back to the default rule) the allow-list of ``namespace`` (no
    commit). Returns ``created``, ``configured``, ``unchanged`` or ``deleted``."""
    row = session.get(AllowedPriorityClassesRecord, namespace)
    if names is None:
        if row is None:
            return "unchanged"
        session.delete(row)
        return "deleted"
    return _upsert(session, AllowedPriorityClassesRecord, (namespace,), {
        "namespace": namespace, "names": sorted(set(names)), "updated_at": now or datetime.now(UTC)})


def list_budgets(session: Session, namespace: str | None = None) -> list[Budget]:
    stmt = select(BudgetRecord)
    if namespace is not None:
        stmt = stmt.where(BudgetRecord.namespace == namespace)  # type: ignore[arg-type]
    return [Budget(r.name, r.namespace, r.daily_usd, r.monthly_usd, r.enforcement)
            for r in session.exec(stmt).all()]


def list_reservations(session: Session) -> list[Reservation]:
    return [Reservation(r.name, r.pool, Resources(r.cpu, r.memory_gib, r.gpus), r.priority_class, r.namespace)
            for r in session.exec(select(ReservationRecord)).all()]


DRY_RUN_KIND = "dry-run"  # ledger rows of dry-run jobs: simulated spend, never in a budget


def record_spend(
    session: Session, namespace: str, usd: float, at: datetime, *, job_id: str = "", kind: str = "adjustment"
) -> None:
    """Add a ledger row (no commit). Use ``kind="actual"`` with the difference between a finished run's
    real cost and its estimate (``kind=DRY_RUN_KIND`` for a dry-run job's: simulated, never budgeted)."""
    session.add(SpendRecord(namespace=namespace, job_id=job_id, usd=float(usd), kind=kind, at=at))


def record_spends(session: Session, entries: Sequence[tuple[str, float, datetime, str, str]]) -> int:
    """:func:`record_spend` for many rows ``(namespace, usd, at, job_id, kind)`` in one executemany (the
    scheduler's path for the runs a cycle ended; no ORM object per row). No commit; returns the count."""
    rows = [{"namespace": ns, "job_id": job_id, "usd": float(usd), "kind": kind, "at": at}
            for ns, usd, at, job_id, kind in entries]
    if rows:
        session.execute(sa.insert(SpendRecord.__table__), rows)  # type: ignore[attr-defined]
    return len(rows)


def _month_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _option_usd(placement_json: str | None) -> float:
    if not placement_json:
        return 0.0
    try:
        data = json.loads(placement_json)
        return float(data.get("total_usd", 0.0)) if isinstance(data, Mapping) else 0.0
    except (ValueError, TypeError):
        return 0.0


def spend_entries(
    session: Session, since: datetime, namespace: str | None = None, *, dry_run: bool = False
) -> list[SpendEntry]:
    """Spend since ``since``: placed jobs' estimates plus the ledger (see the module docstring). Real spend
    by default; ``dry_run=True`` gives the simulated spend of dry-run jobs instead (never both)."""
    out: list[SpendEntry] = []
    jobs = select(JobRow.namespace, JobRow.id, JobRow.placement_json, JobRow.started_at,  # type: ignore[call-overload]
                  JobRow.updated_at).where(JobRow.placement_json.is_not(None),  # type: ignore[union-attr]
                                           JobRow.dry_run == dry_run)
    if namespace is not None:
        jobs = jobs.where(JobRow.namespace == namespace)
    for ns, job_id, placement, started, updated in session.exec(jobs).all():
        when = utc(started or updated)
        if when >= since:
            out.append(SpendEntry(ns, _option_usd(placement), when, job_id))
    ledger = select(SpendRecord).where(SpendRecord.at >= since)  # type: ignore[arg-type]
    ledger = ledger.where((SpendRecord.kind == DRY_RUN_KIND) if dry_run  # type: ignore[arg-type]
                          else (SpendRecord.kind != DRY_RUN_KIND))
    if namespace is not None:
        ledger = ledger.where(SpendRecord.namespace == namespace)  # type: ignore[arg-type]
    out.extend(SpendEntry(r.namespace, r.usd, utc(r.at), r.job_id) for r in session.exec(ledger).all())
    return out


def budget_burn(session: Session, namespace: str, now: datetime) -> Burn:
    """Burn and projected month-end spend of ``namespace`` with its (first) budget's limits; the simulated
    spend of its dry-run jobs apart (``dry_run_*``, in no limit nor projection)."""
    budgets = list_budgets(session, namespace)
    since = _month_start(now) - timedelta(seconds=1)
    real = budget_mod.burn(namespace, spend_entries(session, since, namespace), now,
                           budgets[0] if budgets else None)
    simulated = budget_mod.burn(namespace, spend_entries(session, since, namespace, dry_run=True), now)
    return dataclasses.replace(real, dry_run_today_usd=simulated.today_usd, dry_run_month_usd=simulated.month_usd)


def workload_from_row(row: Any, *, estimated_usd: float | None = None) -> Workload:
    """The policies' view of a stored job row (``broker.store.JobRow`` or a row with the same columns)."""
    from broker.spec import parse_job_spec

    spec = parse_job_spec(json.loads(row.spec_json), now=utc(row.created_at))
    placement = json.loads(row.placement_json) if getattr(row, "placement_json", None) else {}
    host = placement.get("instance_type") if placement.get("provider") == "onprem" else None
    return Workload.from_spec(
        row.id, spec, created_at=utc(row.created_at), priority=int(row.priority or 0),
        estimated_usd=_option_usd(row.placement_json) if estimated_usd is None else estimated_usd,
        started_at=utc(row.started_at) if getattr(row, "started_at", None) else None, host=host,
    ).with_(namespace=row.namespace)


def active_workloads(session: Session) -> list[Workload]:
    """Admitted and running jobs (PLACED, PROVISIONING, RUNNING) as workloads."""
    rows = session.exec(select(JobRow).where(JobRow.state.in_(_ACTIVE))).all()  # type: ignore[attr-defined]
    out = []
    for row in rows:
        try:
            out.append(workload_from_row(row))
        except SpecError:
            continue
    return out


def load_snapshot(
    session: Session,
    *,
    now: datetime,
    admitted: Sequence[Workload] | None = None,
    pool_free: Mapping[str, Resources] | None = None,
) -> PolicySnapshot:
    """Everything admission needs, read once per cycle. ``admitted`` defaults to :func:`active_workloads`
    (read only when some quota or reservation exists); spend is read only when budgets exist."""
    quotas = tuple(list_quotas(session))
    budgets = tuple(list_budgets(session))
    reservations = tuple(list_reservations(session))
    if admitted is None:
        admitted = active_workloads(session) if (quotas or reservations) else []
    spend = tuple(spend_entries(session, _month_start(now) - timedelta(seconds=1))) if budgets else ()
    return PolicySnapshot(
        now=now, admitted=tuple(admitted), quotas=quotas, budgets=budgets, spend=spend,
        priority_classes=list_priority_classes(session), reservations=reservations,
        pool_free=dict(pool_free or {}),
    )


def resolve_priority(session: Session, class_name: str | None, explicit: int | None = None) -> int:
    """The priority value to store with a job at submission (the class's value, the global default, the
    spec's raw ``priority``, else 0). An unknown class gives 0; admission then holds the job."""
    resolved = priority_mod.resolve(class_name, list_priority_classes(session), explicit=explicit)
    return resolved.value if isinstance(resolved, priority_mod.ResolvedPriority) else 0


class PolicyAdmission:
    """The scheduler's admission hook: ``hook(job, snapshot) -> None | reason``.

    ``job`` is the scheduler's queued job (``id``, ``namespace``, ``priority``, ``created_at``, ``spec``);
    ``snapshot`` its cycle snapshot (``now``, ``onprem_free``). The policy snapshot is loaded from the store
    once per scheduler snapshot and carried forward as jobs are admitted, so a burst is cut exactly where
    a quota or budget runs out. ``estimate(job) -> usd`` prices a job for budgets (``None``: the job's
    cheapest placement is not known at admission, so budgets only count what was already placed). Alerts
    of soft budgets go to ``on_alert(job_id, text)``.
    """

    def __init__(
        self,
        store: Any,
        *,
        estimate: Callable[[Any], float] | None = None,
        checks: Sequence[Check] = ADMISSION_CHECKS,
        on_alert: Callable[[str, str], None] | None = None,
    ) -> None:
        self.store = store
        self.estimate = estimate
        self.checks = tuple(checks)
        self.on_alert = on_alert
        self._for: Any = None  # the scheduler snapshot the policy snapshot was loaded for (kept alive)
        self._snap: PolicySnapshot | None = None

    def _policy_snapshot(self, snapshot: Any) -> PolicySnapshot:
        if self._snap is None or self._for is not snapshot:
            free = {h: Resources(f.get("vcpus", 0.0), f.get("memory_gib", 0.0), f.get("gpus", 0.0))
                    for h, f in (getattr(snapshot, "onprem_free", None) or {}).items()}
            with self.store.read() as session:
                self._snap = load_snapshot(session, now=snapshot.now, pool_free=free)
            self._for = snapshot
        return self._snap

    def workload(self, job: Any, snap: PolicySnapshot) -> Workload:
        w = Workload.from_spec(job.id, job.spec, created_at=job.created_at, priority=job.priority or None,
                               estimated_usd=float(self.estimate(job)) if self.estimate else 0.0)
        return with_resolved_priority(w.with_(namespace=job.namespace), snap.priority_classes)

    def __call__(self, job: Any, snapshot: Any) -> str | None:
        snap = self._policy_snapshot(snapshot)
        w = self.workload(job, snap)
        result = admit(w, snap, self.checks)
        if result.admitted:
            self._snap = snap.with_admitted(w)
            if self.on_alert is not None:
                for alert in result.alerts:
                    self.on_alert(job.id, alert)
        return result.reason
