"""Build a :class:`~broker.reports.model.Report` from decision records.

Every figure comes from the prices stored in the records: history is never re-priced with
today's catalog. Only the what-if section re-places jobs, and it does so against the catalog
*version each record used* (see :mod:`broker.reports.whatif`).

Which records count: previews are only counted; of the placements, a job placed more than once
(after a failover) counts once, at its last placement. Records without a ``job_id`` count each.

Baselines: each placed decision stores, at decision time, what every baseline needs (priced from the same
catalog, egress model and constraints: :mod:`policies.placement.baselines`); the report only adds them up:

* ``on-demand``: every job at its best option with spot excluded (its deadline and other constraints kept);
  jobs with no feasible on-demand option are not counted in this baseline (``detail`` says how many);
* ``ignore-data``: every job at the offer that is cheapest on compute alone, paying that offer's egress and
  transfer hours;
* ``single-region``: every job in one cloud region, the region with the lowest sum over the jobs, among the
  regions where every job is feasible; jobs that no cloud region can run (on-prem-only requests) count at
  their recorded cost.

Each baseline is compared with the broker's recorded cost of the same jobs (``broker_usd``), so
``savings_usd = cost_usd - broker_usd`` is a difference of two sums a reader can redo from the records.
Records written before baselines were stored have none: they are left out of every baseline and
``exact_jobs`` (jobs priced) is below ``jobs``.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any, overload

from broker.reports.model import (
    Baseline,
    DailySpend,
    DeadlineSummary,
    EgressRow,
    JobDecision,
    OptionView,
    Report,
    ReportFilters,
    SpendRow,
    Summary,
)

__all__ = [
    "build_report",
    "Rec",
    "to_rec",
    "options_of",
    "BASELINE_LABELS",
    "option_view",
    "no_gc",
    "DecisionList",
    "decision_plain",
]


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while many small objects are built (restored after),
    then move what was built straight to the oldest generation.

    Design choice: a report over 100k records builds about 600k containers (records, lists,
    dicts); the collector's passes over them took about 40% of the CPU time and free nothing (they
    hold no cycles and are freed by reference counting when the report is dropped). Pausing it is
    not enough: once re-enabled, the first young-generation pass scans every object made while it
    was paused, and each later promotion scans them again (about 0.9 s of 3.5 s). So on exit every
    tracked object is promoted to the oldest generation without a scan (``gc.freeze()`` then
    ``gc.unfreeze()``, both constant time); the next full collection, which runs as usual, still
    sees everything, so cyclic garbage made meanwhile anywhere in the process is collected then.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was:
            gc.enable()


BASELINE_LABELS: Mapping[str, str] = {
    "single-region": "everything on the single cheapest cloud region",
    "on-demand": "everything on-demand (no spot)",
    "ignore-data": "ignore data location (cheapest compute only, then pay the egress)",
}

_EPS = 0.005  # half a cent: differences below it are not worth a word


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@dataclass(slots=True)
class Rec:
    """A decision record as the report reads it (independent of the ORM)."""

    id: int | None
    job_id: str | None
    namespace: str | None
    kind: str
    job_name: str
    created_at: datetime
    request: dict[str, Any]
    chosen: dict[str, Any] | None
    alternatives: list[dict[str, Any]]
    rejected: dict[str, int]
    considered: int
    feasible: int
    policy: str
    catalog_version: str
    explanation: str
    nodes: int
    deadline: datetime | None
    predicted_finish_at: datetime | None
    runtime_hours: float | None
    actual_cost_usd: float | None
    finished_at: datetime | None
    deadline_met: bool | None
    baselines: dict[str, Any] | None = None


def to_rec(record: Any) -> Rec:
    """Read a :class:`broker.decisions.DecisionRecord` (or any object with its attributes)."""
    if isinstance(record, Rec):
        return record
    created = _utc(record.created_at)
    assert created is not None
    return Rec(
        id=record.id,
        job_id=record.job_id,
        namespace=record.namespace,
        kind=record.kind,
        job_name=record.job_name,
        created_at=created,
        request=dict(record.request or {}),
        chosen=record.chosen,
        alternatives=list(record.alternatives or []),
        rejected=dict(record.rejected or {}),
        considered=int(record.considered or 0),
        feasible=int(record.feasible or 0),
        policy=record.policy or "",
        catalog_version=record.catalog_version or "",
        explanation=record.explanation or "",
        nodes=int(record.nodes or 1),
        deadline=_utc(record.deadline),
        predicted_finish_at=_utc(record.predicted_finish_at),
        runtime_hours=record.runtime_hours,
        actual_cost_usd=record.actual_cost_usd,
        finished_at=_utc(record.finished_at),
        deadline_met=record.deadline_met,
        baselines=getattr(record, "baselines", None) or None,
    )


def option_view(d: Mapping[str, Any]) -> OptionView:
    """The :class:`OptionView` of a stored option dict (missing keys read as empty / zero)."""
    p = _option_plain(d)
    return OptionView(
        p["provider"], p["region"], p["instance_type"], p["capacity"], p["site"], p["hourly_usd"],
        p["compute_usd"], p["egress_usd"], p["transfer_hours"], p["total_usd"], p["finish_hours"],
    )


_OPTION_FIELDS = (
    "provider", "region", "instance_type", "capacity", "site", "hourly_usd", "compute_usd", "egress_usd",
    "transfer_hours", "total_usd", "finish_hours",
)
_option_fast = itemgetter(*_OPTION_FIELDS)


def _option_plain(d: Mapping[str, Any]) -> dict[str, Any]:
    """A stored option as the report's JSON writes it: the :class:`OptionView` fields, typed as
    :func:`option_view` types them, in its field order, plus ``location``."""
    try:  # every stored option has every key (option_to_dict): one C call reads them
        provider, region, itype, capacity, site, hourly, compute, egress, transfer, total, finish = _option_fast(d)
    except KeyError:
        provider, region, itype, capacity, site = (
            d.get("provider", ""), d.get("region", ""), d.get("instance_type", ""), d.get("capacity", ""),
            d.get("site", "cloud"),
        )
        hourly, compute, egress, transfer, total, finish = (
            d.get(k, 0.0) for k in ("hourly_usd", "compute_usd", "egress_usd", "transfer_hours", "total_usd",
                                    "finish_hours")
        )
    provider = str(provider)
    region = str(region)
    return {
        "provider": provider,
        "region": region,
        "instance_type": str(itype),
        "capacity": str(capacity),
        "site": str(site),
        "hourly_usd": float(hourly),
        "compute_usd": float(compute),
        "egress_usd": float(egress),
        "transfer_hours": float(transfer),
        "total_usd": float(total),
        "finish_hours": float(finish),
        "location": f"{provider}:{region}",
    }


_KEY_FIELDS = ("provider", "region", "zone", "instance_type", "capacity")
_key_fast = itemgetter(*_KEY_FIELDS)


def _key(d: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two stored options the same option (a missing key reads as ``None``)."""
    try:
        return _key_fast(d)  # type: ignore[no-any-return]
    except KeyError:
        return tuple(d.get(k) for k in _KEY_FIELDS)


def options_of(rec: Rec) -> list[dict[str, Any]]:
    """The stored options of a placed record: the choice first, then the alternatives that differ."""
    if rec.chosen is None:
        return []
    ck = _key(rec.chosen)
    return [rec.chosen] + [a for a in rec.alternatives if _key(a) != ck]


def _counted(recs: Iterable[Rec]) -> tuple[list[Rec], int]:
    """Placement records that count (last per job), oldest first; and the number of previews."""
    previews = 0
    last: dict[str, Rec] = {}
    anonymous: list[Rec] = []
    for r in recs:
        if r.kind != "placement":
            previews += 1
        elif r.job_id is None:
            anonymous.append(r)
        else:
            prev = last.get(r.job_id)
            if prev is None or (r.created_at, r.id or 0) >= (prev.created_at, prev.id or 0):
                last[r.job_id] = r
    out = anonymous + list(last.values())
    out.sort(key=lambda r: (r.created_at, r.id or 0))
    return out, previews


def _moved_inputs(rec: Rec) -> list[tuple[str, float]]:
    """(source location, GiB) of the inputs not already where the job runs."""
    assert rec.chosen is not None
    dest = f"{rec.chosen.get('provider')}:{rec.chosen.get('region')}"
    out = []
    for d in rec.request.get("data", ()) or ():
        src = str(d.get("location", ""))
        size = float(d.get("size_gib", 0.0))
        if src and src != dest and size > 0:
            out.append((src, size))
    return out


class _BaselineAcc:
    """Running sums of the three baselines, fed one placed record at a time (see the module doc)."""

    __slots__ = ("n", "priced", "priced_usd", "od_cost", "od_broker", "od_jobs", "ignore_cost", "region_sum",
                 "region_hits", "region_jobs", "region_broker", "offcloud_usd")

    def __init__(self) -> None:
        self.n = 0  # placed jobs
        self.priced = 0  # of them, with baselines stored at decision time
        self.priced_usd = 0.0  # the broker's recorded cost of those
        self.od_cost = self.od_broker = 0.0
        self.od_jobs = 0
        self.ignore_cost = 0.0
        self.region_sum: dict[str, float] = defaultdict(float)  # per region: sum of the jobs' totals there
        self.region_hits: dict[str, int] = defaultdict(int)  # per region: jobs feasible there
        self.region_jobs = 0  # jobs feasible in some cloud region
        self.region_broker = 0.0  # broker cost of those
        self.offcloud_usd = 0.0  # recorded cost of priced jobs no cloud region can run

    def add(self, chosen_usd: float, baselines: Mapping[str, Any] | None) -> None:
        """Add one placed job: its recorded total and the baselines stored with its decision."""
        self.n += 1
        if not baselines:
            return
        self.priced += 1
        self.priced_usd += chosen_usd
        od = baselines.get("on-demand")
        if od is not None:
            self.od_cost += float(od["total_usd"])
            self.od_broker += chosen_usd
            self.od_jobs += 1
        ignore = baselines.get("ignore-data")
        self.ignore_cost += chosen_usd if ignore is None else float(ignore["total_usd"])
        regions = baselines.get("regions") or {}
        if regions:
            self.region_jobs += 1
            self.region_broker += chosen_usd
            rsum, hits = self.region_sum, self.region_hits
            for loc, t in regions.items():
                rsum[loc] += float(t)
                hits[loc] += 1
        else:
            self.offcloud_usd += chosen_usd

    def baselines(self) -> tuple[Baseline, ...]:
        n, priced = self.n, self.priced
        skipped = n - priced
        note = f"; {skipped} jobs recorded without baselines not counted" if skipped else ""

        def make(key: str, cost: float, broker: float, exact: int, detail: str = "") -> Baseline:
            savings = cost - broker
            pct = 100.0 * savings / cost if cost > 0 else 0.0
            return Baseline(key, BASELINE_LABELS[key], cost, broker, savings, pct, exact, n, detail + note)

        full = [loc for loc, h in self.region_hits.items() if h == self.region_jobs]
        if self.region_jobs and full:
            region = min(full, key=lambda loc: (self.region_sum[loc], loc))
            region_cost = self.region_sum[region] + self.offcloud_usd
            off = priced - self.region_jobs
            region_detail = f"{region}" + (f" ({off} jobs that no cloud region can run counted at their recorded cost)"
                                           if off else "")
            single = make("single-region", region_cost, self.priced_usd, priced, region_detail)
        else:
            why = ("no cloud region can run every job" if self.region_jobs else "no job could run in a cloud region")
            single = make("single-region", self.priced_usd, self.priced_usd, 0, why)
        no_od = priced - self.od_jobs
        return (
            single,
            make("on-demand", self.od_cost, self.od_broker, self.od_jobs,
                 f"{no_od} jobs had no on-demand option and are not counted" if no_od else ""),
            make("ignore-data", self.ignore_cost, self.priced_usd, priced),
        )


def _spend_rows(acc: Mapping[str, list[float]]) -> tuple[SpendRow, ...]:
    rows = [SpendRow(k, int(v[0]), v[1], v[2], v[3], v[4], int(v[5])) for k, v in acc.items()]
    rows.sort(key=lambda s: (-s.estimated_usd, s.key))
    return tuple(rows)


_DEADLINE_REASON: dict[str, bool] = {}  # rejection reason -> whether it names a deadline (memo)


def _too_slow(rejected: Mapping[str, int]) -> int:
    """How many offers ``rejected`` says could not meet the deadline."""
    n = 0
    for k, v in rejected.items():
        hit = _DEADLINE_REASON.get(k)
        if hit is None:
            hit = _DEADLINE_REASON[k] = "deadline" in k.lower()
        if hit:
            n += v
    return n


def _why(rec: Rec, chosen: Mapping[str, Any] | None, runner: Mapping[str, Any] | None) -> str:
    """Why the choice won, from the options as :func:`_option_plain` types them."""
    if chosen is None:
        top = sorted(rec.rejected.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        named = ", ".join(f"{k} x{v}" for k, v in top) or "no offers matched"
        return f"nothing feasible among {rec.considered} offers ({named})"
    c_total, c_compute, c_egress = chosen["total_usd"], chosen["compute_usd"], chosen["egress_usd"]
    head = (
        f"{chosen['provider']} {chosen['region']} ({chosen['instance_type']}, {chosen['capacity']}): "
        f"${c_total:,.2f} = ${c_compute:,.2f} compute + ${c_egress:,.2f} egress{_risk_text(chosen)}"
    )
    if runner is None:
        return f"{head}; the only feasible option of {rec.considered} offers considered"
    r_total, r_compute, r_egress = runner["total_usd"], runner["compute_usd"], runner["egress_usd"]
    margin = r_total - c_total
    if margin < -_EPS:
        faster = runner["finish_hours"] - chosen["finish_hours"]
        tail = f"finishes {faster:.1f} h sooner" if faster > 0 else "preferred by the objective"
        verdict = f"costs ${-margin:,.2f} more than the runner-up but {tail}"
    else:
        reasons: list[str] = []
        egress_saved = r_egress - c_egress
        compute_saved = r_compute - c_compute
        if egress_saved > _EPS:
            reasons.append(f"${egress_saved:,.2f} egress avoided")
        elif egress_saved < -_EPS:
            reasons.append(f"despite ${-egress_saved:,.2f} more egress")
        if compute_saved > _EPS:
            reasons.append(f"${compute_saved:,.2f} less compute")
        elif compute_saved < -_EPS:
            reasons.append(f"despite ${-compute_saved:,.2f} more compute")
        if chosen["capacity"] == "spot" and runner["capacity"] != "spot":
            reasons.append("spot capacity")
        verdict = f"beats the runner-up by ${margin:,.2f}"
        if reasons:
            verdict += " (" + ", ".join(reasons) + ")"
    too_slow = _too_slow(rec.rejected) if rec.rejected else 0
    extra = f"; {too_slow} offers could not meet the deadline" if too_slow else ""
    return (
        f"{head}; {verdict}; runner-up {runner['provider']} {runner['region']} ({runner['instance_type']}, "
        f"{runner['capacity']}) ${r_total:,.2f} = ${r_compute:,.2f} compute + ${r_egress:,.2f} egress"
        f"{_risk_text(runner)}{extra}"
    )


def _risk_text(o: Mapping[str, Any]) -> str:
    """`` + $x spot interruption risk`` when the option's total carries one: the part of the total that is
    neither compute nor egress (the expected interruption cost of a spot option), so the sum stays checkable."""
    risk = o["total_usd"] - o["compute_usd"] - o["egress_usd"]
    return f" + ${risk:,.2f} spot interruption risk" if risk >= _EPS else ""


def _parts(
    rec: Rec,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, float | None, str, bool | None, float]:
    """What a job decision derives from its record: (chosen, runner-up) as plain option dicts,
    the margin, why, whether the deadline was predicted to be met, and the GiB of its inputs."""
    chosen = runner = None
    if rec.chosen is not None:
        chosen = _option_plain(rec.chosen)
        ck = _key(rec.chosen)
        for a in rec.alternatives:  # the runner-up: options_of(rec)[1]
            if _key(a) != ck:
                runner = _option_plain(a)
                break
    margin = None if chosen is None or runner is None else runner["total_usd"] - chosen["total_usd"]
    deadline, predicted = rec.deadline, rec.predicted_finish_at
    met_pred = None if deadline is None or predicted is None else predicted <= deadline
    data_gib = sum(float(d.get("size_gib", 0.0)) for d in rec.request.get("data", ()) or ())
    return chosen, runner, margin, _why(rec, chosen, runner), met_pred, data_gib


def _view(p: dict[str, Any] | None) -> OptionView | None:
    if p is None:
        return None
    return OptionView(
        p["provider"], p["region"], p["instance_type"], p["capacity"], p["site"], p["hourly_usd"],
        p["compute_usd"], p["egress_usd"], p["transfer_hours"], p["total_usd"], p["finish_hours"],
    )


def _decision(rec: Rec) -> JobDecision:
    chosen, runner, margin, why, met_pred, data_gib = _parts(rec)
    return JobDecision(
        record_id=rec.id,
        job_id=rec.job_id,
        job_name=rec.job_name,
        namespace=rec.namespace,
        created_at=rec.created_at,
        chosen=_view(chosen),
        runner_up=_view(runner),
        margin_usd=margin,
        why=why,
        policy=rec.policy,
        catalog_version=rec.catalog_version,
        considered=rec.considered,
        feasible=rec.feasible,
        rejected=dict(rec.rejected),
        data_gib=data_gib,
        deadline=rec.deadline,
        predicted_finish_at=rec.predicted_finish_at,
        deadline_met_predicted=met_pred,
        finished_at=rec.finished_at,
        runtime_hours=rec.runtime_hours,
        actual_cost_usd=rec.actual_cost_usd,
        deadline_met=rec.deadline_met,
    )


def decision_plain(rec: Rec) -> dict[str, Any]:
    """The JSON form of ``rec``'s job decision: equal to ``Report.to_dict()`` of the
    :class:`JobDecision` the report builds for it, without building that object."""
    chosen, runner, margin, why, met_pred, data_gib = _parts(rec)
    deadline, predicted, finished = rec.deadline, rec.predicted_finish_at, rec.finished_at
    rejected = rec.rejected
    return {
        "record_id": rec.id,
        "job_id": rec.job_id,
        "job_name": rec.job_name,
        "namespace": rec.namespace,
        "created_at": rec.created_at.isoformat(),
        "chosen": chosen,
        "runner_up": runner,
        "margin_usd": margin,
        "why": why,
        "policy": rec.policy,
        "catalog_version": rec.catalog_version,
        "considered": rec.considered,
        "feasible": rec.feasible,
        "rejected": (
            dict(rejected) if all(type(k) is str for k in rejected) else {str(k): v for k, v in rejected.items()}
        ),
        "data_gib": data_gib,
        "deadline": None if deadline is None else deadline.isoformat(),
        "predicted_finish_at": None if predicted is None else predicted.isoformat(),
        "deadline_met_predicted": met_pred,
        "finished_at": None if finished is None else finished.isoformat(),
        "runtime_hours": rec.runtime_hours,
        "actual_cost_usd": rec.actual_cost_usd,
        "deadline_met": rec.deadline_met,
    }


class DecisionList(Sequence[JobDecision]):
    """The report's job decisions, built on demand from the counted records.

    Design choice: a report over 100k records needs every decision only for CSV and JSON, and
    those read :meth:`plain_dicts` (plain dicts, no objects per decision); the HTML shows the
    latest 500. So a :class:`JobDecision` is built only when one is read (indexing, slicing or
    iterating; a slice is a tuple). Equal to any sequence holding equal decisions.
    """

    __slots__ = ("_recs",)

    def __init__(self, recs: Sequence[Rec]) -> None:
        self._recs = tuple(recs)

    def __len__(self) -> int:
        return len(self._recs)

    @overload
    def __getitem__(self, index: int) -> JobDecision: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[JobDecision, ...]: ...

    def __getitem__(self, index: int | slice) -> JobDecision | tuple[JobDecision, ...]:
        if isinstance(index, slice):
            return tuple(_decision(r) for r in self._recs[index])
        return _decision(self._recs[index])

    def __iter__(self) -> Iterator[JobDecision]:
        return (_decision(r) for r in self._recs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DecisionList({len(self._recs)} decisions)"

    def plain_dicts(self) -> list[dict[str, Any]]:
        """Every decision in its JSON form (see :func:`decision_plain`), oldest first."""
        return [decision_plain(r) for r in self._recs]


def build_report(
    records: Iterable[Any],
    *,
    whatif_catalogs: Any = None,
    egress: Any = None,
    place_fn: Callable[..., Any] | None = None,
    exclude_providers: Sequence[str] | None = None,
    whatif_max_jobs: int = 300,
    filters: ReportFilters | None = None,
    generated_at: datetime | None = None,
    dry_run_jobs: Collection[str] = (),
) -> Report:
    """The placement report of ``records`` (``DecisionRecord`` rows, in any order).

    ``whatif_catalogs`` is where recorded catalog versions are loaded from for the what-if
    section: a ``pricing.CatalogStore`` (anything with ``.load(version)``) or a callable
    ``version -> Catalog``; ``None`` leaves the what-if section ``unavailable`` with the reason.
    ``egress`` (an ``EgressModel``) and ``place_fn`` (``policies.placement.place``) default to the
    project's own when importable. ``exclude_providers`` are the providers the "provider excluded"
    scenarios drop (default: the provider with the highest spend). At most ``whatif_max_jobs``
    jobs are re-placed per scenario (an evenly spread sample). ``dry_run_jobs`` are the ids of jobs that ran
    in dry-run mode (:func:`broker.reports.store.dry_run_job_ids`): their spend is counted apart in the summary.
    Pure apart from the catalog loads.
    """
    with no_gc():
        return _build(records, whatif_catalogs, egress, place_fn, exclude_providers, whatif_max_jobs, filters,
                      generated_at, dry_run_jobs)


def _build(
    records: Iterable[Any],
    whatif_catalogs: Any,
    egress: Any,
    place_fn: Callable[..., Any] | None,
    exclude_providers: Sequence[str] | None,
    whatif_max_jobs: int,
    filters: ReportFilters | None,
    generated_at: datetime | None,
    dry_run_jobs: Collection[str] = (),
) -> Report:
    """One pass over the counted records feeds every section (summary, baselines, spend, egress,
    daily, deadlines); the job decisions are built on demand (:class:`DecisionList`)."""
    recs = [r if type(r) is Rec else to_rec(r) for r in records]
    counted, previews = _counted(recs)
    placed: list[Rec] = []

    est = comp = egr = moved_gib = actual = est_fin = 0.0
    finished = 0
    considered = sum(r.considered for r in counted)
    routes: dict[tuple[str, str], list[float]] = {}
    daily: dict[str, list[float]] = {}
    days: dict[Any, str] = {}  # date -> ISO day, so each day is formatted once
    spend: tuple[dict[str, list[float]], ...] = ({}, {}, {}, {})  # provider, region, namespace, capacity
    base = _BaselineAcc()
    dl_jobs = dl_met_pred = dl_finished = dl_met = dl_missed = dl_too_slow = 0
    dl_costs: list[float] = []
    dry = dry_run_jobs if isinstance(dry_run_jobs, (set, frozenset)) else set(dry_run_jobs)
    dry_n, dry_usd = 0, 0.0
    for r in counted:
        c = r.chosen
        if c is None:
            continue
        placed.append(r)
        total = float(c["total_usd"])
        if dry and r.job_id in dry:
            dry_n += 1
            dry_usd += total
        compute = float(c["compute_usd"])
        e_usd = float(c["egress_usd"])
        est += total
        comp += compute
        egr += e_usd
        ran = r.actual_cost_usd
        if ran is not None:
            finished += 1
            actual += ran
            est_fin += total
        moved = _moved_inputs(r)
        if moved:
            gib_sum = sum(g for _, g in moved)
            moved_gib += gib_sum
            dest = f"{c['provider']}:{c['region']}"
            for src, gib in moved:
                row = routes.get((src, dest))
                if row is None:
                    row = routes[(src, dest)] = [0.0, 0.0, 0]
                row[0] += gib
                row[1] += e_usd * gib / gib_sum if gib_sum > 0 else 0.0
                row[2] += 1
        date = r.created_at.date()
        iso_day = days.get(date)
        if iso_day is None:
            iso_day = days[date] = date.isoformat()
        day = daily.get(iso_day)
        if day is None:
            day = daily[iso_day] = [0, 0.0]
        day[0] += 1
        day[1] += total
        # spend by provider, region, namespace and capacity kind
        keys = (str(c["provider"]), f"{c['provider']}:{c['region']}", r.namespace or "-", str(c.get("capacity", "")))
        for acc, key in zip(spend, keys, strict=True):
            srow = acc.get(key)
            if srow is None:
                srow = acc[key] = [0, 0.0, 0.0, 0.0, 0.0, 0]
            srow[0] += 1
            srow[1] += total
            srow[2] += compute
            srow[3] += e_usd
            if ran is not None:
                srow[4] += ran
                srow[5] += 1
        base.add(total, r.baselines)
        if r.deadline is not None:
            dl_jobs += 1
            if r.predicted_finish_at is not None and r.predicted_finish_at <= r.deadline:
                dl_met_pred += 1
            if r.deadline_met is not None:
                dl_finished += 1
                if r.deadline_met is True:
                    dl_met += 1
                elif r.deadline_met is False:
                    dl_missed += 1
            dl_costs.append(total)
            dl_too_slow += _too_slow(r.rejected)
    unplaced = len(counted) - len(placed)

    summary = Summary(
        jobs_placed=len(placed),
        previews=previews,
        unplaced=unplaced,
        estimated_spend_usd=est,
        compute_usd=comp,
        egress_usd=egr,
        data_moved_gib=moved_gib,
        finished_jobs=finished,
        actual_spend_usd=actual,
        estimated_finished_usd=est_fin,
        offers_considered=considered,
        first_at=recs and min(r.created_at for r in recs) or None,
        last_at=recs and max(r.created_at for r in recs) or None,
        dry_run_jobs=dry_n,
        dry_run_usd=dry_usd,
    )
    egress_rows = sorted(
        (EgressRow(s, d, v[0], v[1], int(v[2])) for (s, d), v in routes.items()),
        key=lambda e: (-e.usd, -e.gib, e.source, e.destination),
    )
    by_provider, by_region, by_namespace, by_capacity = (_spend_rows(acc) for acc in spend)
    if exclude_providers is None:  # the provider with the highest spend (what run_whatif would pick)
        top = max(by_provider, key=lambda row: (row.estimated_usd, row.key), default=None)
        exclude_providers = [top.key] if top is not None else []

    from broker.reports.whatif import run_whatif  # local: keeps the import graph one-way

    whatif, premium, premium_note = run_whatif(
        placed,
        catalogs=whatif_catalogs,
        egress=egress,
        place_fn=place_fn,
        exclude_providers=exclude_providers,
        max_jobs=whatif_max_jobs,
    )
    deadlines = DeadlineSummary(
        jobs_with_deadline=dl_jobs,
        met_predicted=dl_met_pred,
        finished=dl_finished,
        met=dl_met,
        missed=dl_missed,
        cost_usd=sum(dl_costs),
        offers_too_slow=dl_too_slow,
        premium_usd=premium,
        premium_note=premium_note,
    )

    return Report(
        generated_at=generated_at or datetime.now(UTC),
        filters=filters or ReportFilters(),
        summary=summary,
        baselines=base.baselines(),
        by_provider=by_provider,
        by_region=by_region,
        by_namespace=by_namespace,
        by_capacity=by_capacity,
        egress=tuple(egress_rows),
        decisions=DecisionList(counted),
        deadlines=deadlines,
        whatif=whatif,
        daily=tuple(DailySpend(k, int(v[0]), v[1]) for k, v in sorted(daily.items())),
        catalog_versions=tuple(sorted({r.catalog_version for r in counted if r.catalog_version})),
    )
