"""Build a :class:`~broker.reports.model.Report` from decision records.

Every figure comes from the prices stored in the records: history is never re-priced with
today's catalog. Only the what-if section re-places jobs, and it does so against the catalog
*version each record used* (see :mod:`broker.reports.whatif`).

Which records count: previews are only counted; of the placements, a job placed more than once
(after a failover) counts once, at its last placement. Records without a ``job_id`` count each.

Baselines (all from the stored options of each job: the choice plus its ranked alternatives):

* ``single-region``: every job in one cloud region, the one with the lowest total. A job's cost
  there is its cheapest stored option in that region;
* ``on-demand``: no spot: each job's cheapest stored option whose capacity is not ``spot``;
* ``ignore-data``: cheapest compute first, then pay the egress: the stored option with the lowest
  ``compute_usd`` (ties: lowest total), at its total (compute + egress).

Design choice: a placement stores the top N options ranked by total cost, so when a baseline's
option is not among them it costs at least as much as the dearest stored option; that value is
used, which makes each baseline a lower bound and the savings never overstated. ``exact_jobs``
says for how many jobs the baseline was priced exactly.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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

__all__ = ["build_report", "Rec", "to_rec", "options_of", "BASELINE_LABELS", "option_view", "no_gc"]


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while many small objects are built (restored after).

    Design choice: a report over 100k records builds millions of dicts and tuples; the collector's
    generation-2 passes over them took about 40% of the CPU time and free nothing (no cycles)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
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
    )


def option_view(d: Mapping[str, Any]) -> OptionView:
    return OptionView(
        provider=str(d.get("provider", "")),
        region=str(d.get("region", "")),
        instance_type=str(d.get("instance_type", "")),
        capacity=str(d.get("capacity", "")),
        site=str(d.get("site", "cloud")),
        hourly_usd=float(d.get("hourly_usd", 0.0)),
        compute_usd=float(d.get("compute_usd", 0.0)),
        egress_usd=float(d.get("egress_usd", 0.0)),
        transfer_hours=float(d.get("transfer_hours", 0.0)),
        total_usd=float(d.get("total_usd", 0.0)),
        finish_hours=float(d.get("finish_hours", 0.0)),
    )


def _key(d: Mapping[str, Any]) -> tuple[Any, ...]:
    return (d.get("provider"), d.get("region"), d.get("zone"), d.get("instance_type"), d.get("capacity"))


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


def _baselines(placed: Sequence[Rec], broker_usd: float) -> tuple[Baseline, ...]:
    n = len(placed)
    ondemand_cost = 0.0
    ondemand_exact = 0
    ignore_cost = 0.0
    region_base = 0.0  # sum of every job's fallback (dearest stored option)
    region_delta: dict[str, float] = defaultdict(float)
    region_hits: dict[str, int] = defaultdict(int)
    for r in placed:
        opts = options_of(r)
        totals = [float(o["total_usd"]) for o in opts]
        fallback = max(totals)
        # on-demand
        nonspot = [float(o["total_usd"]) for o in opts if o.get("capacity") != "spot"]
        if nonspot:
            ondemand_cost += min(nonspot)
            ondemand_exact += 1
        else:
            ondemand_cost += fallback
        # ignore data location: cheapest compute, then its egress
        best = min(opts, key=lambda o: (float(o["compute_usd"]), float(o["total_usd"])))
        ignore_cost += float(best["total_usd"])
        # single region: cheapest stored option per cloud region
        region_base += fallback
        per_region: dict[str, float] = {}
        for o in opts:
            if o.get("site", "cloud") != "cloud":
                continue
            loc = f"{o['provider']}:{o['region']}"
            t = float(o["total_usd"])
            if loc not in per_region or t < per_region[loc]:
                per_region[loc] = t
        for loc, t in per_region.items():
            region_delta[loc] += t - fallback
            region_hits[loc] += 1

    def make(key: str, cost: float, exact: int, detail: str = "") -> Baseline:
        savings = cost - broker_usd
        pct = 100.0 * savings / cost if cost > 0 else 0.0
        return Baseline(key, BASELINE_LABELS[key], cost, broker_usd, savings, pct, exact, n, detail)

    if region_delta:
        region = min(region_delta, key=lambda loc: (region_delta[loc], loc))
        region_cost = region_base + region_delta[region]
        region_detail = f"{region} (priced exactly for {region_hits[region]} of {n} jobs)"
        region_exact = region_hits[region]
    else:
        region_cost, region_detail, region_exact = broker_usd, "no cloud region among the options", 0
    return (
        make("single-region", region_cost, region_exact, region_detail),
        make("on-demand", ondemand_cost, ondemand_exact),
        make("ignore-data", ignore_cost, n),
    )


def _spend(placed: Sequence[Rec], key_of: Callable[[Rec], str]) -> tuple[SpendRow, ...]:
    acc: dict[str, list[float]] = {}
    for r in placed:
        assert r.chosen is not None
        row = acc.setdefault(key_of(r), [0, 0.0, 0.0, 0.0, 0.0, 0])
        row[0] += 1
        row[1] += float(r.chosen["total_usd"])
        row[2] += float(r.chosen["compute_usd"])
        row[3] += float(r.chosen["egress_usd"])
        if r.actual_cost_usd is not None:
            row[4] += r.actual_cost_usd
            row[5] += 1
    rows = [SpendRow(k, int(v[0]), v[1], v[2], v[3], v[4], int(v[5])) for k, v in acc.items()]
    rows.sort(key=lambda s: (-s.estimated_usd, s.key))
    return tuple(rows)


def _money(x: float) -> str:
    return f"${x:,.2f}"


def _describe(o: OptionView) -> str:
    return f"{o.provider} {o.region} ({o.instance_type}, {o.capacity})"


def _why(rec: Rec, chosen: OptionView | None, runner: OptionView | None) -> str:
    if chosen is None:
        top = sorted(rec.rejected.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        named = ", ".join(f"{k} x{v}" for k, v in top) or "no offers matched"
        return f"nothing feasible among {rec.considered} offers ({named})"
    head = (
        f"{_describe(chosen)}: {_money(chosen.total_usd)} = {_money(chosen.compute_usd)} compute"
        f" + {_money(chosen.egress_usd)} egress"
    )
    if runner is None:
        return f"{head}; the only feasible option of {rec.considered} offers considered"
    margin = runner.total_usd - chosen.total_usd
    reasons: list[str] = []
    egress_saved = runner.egress_usd - chosen.egress_usd
    compute_saved = runner.compute_usd - chosen.compute_usd
    if egress_saved > _EPS:
        reasons.append(f"{_money(egress_saved)} egress avoided")
    elif egress_saved < -_EPS:
        reasons.append(f"despite {_money(-egress_saved)} more egress")
    if compute_saved > _EPS:
        reasons.append(f"{_money(compute_saved)} less compute")
    elif compute_saved < -_EPS:
        reasons.append(f"despite {_money(-compute_saved)} more compute")
    if chosen.capacity == "spot" and runner.capacity != "spot":
        reasons.append("spot capacity")
    if margin < -_EPS:
        faster = runner.finish_hours - chosen.finish_hours
        tail = f"finishes {faster:.1f} h sooner" if faster > 0 else "preferred by the objective"
        verdict = f"costs {_money(-margin)} more than the runner-up but {tail}"
    else:
        verdict = f"beats the runner-up by {_money(margin)}"
        if reasons:
            verdict += " (" + ", ".join(reasons) + ")"
    too_slow = sum(v for k, v in rec.rejected.items() if "deadline" in k.lower())
    extra = f"; {too_slow} offers could not meet the deadline" if too_slow else ""
    return (
        f"{head}; {verdict}; runner-up {_describe(runner)} {_money(runner.total_usd)}"
        f" = {_money(runner.compute_usd)} compute + {_money(runner.egress_usd)} egress{extra}"
    )


def _decision(rec: Rec) -> JobDecision:
    chosen = None if rec.chosen is None else option_view(rec.chosen)
    runner = None
    if rec.chosen is not None:
        opts = options_of(rec)
        if len(opts) > 1:
            runner = option_view(opts[1])
    margin = None if chosen is None or runner is None else runner.total_usd - chosen.total_usd
    met_pred = (
        None
        if rec.deadline is None or rec.predicted_finish_at is None
        else rec.predicted_finish_at <= rec.deadline
    )
    data_gib = sum(float(d.get("size_gib", 0.0)) for d in rec.request.get("data", ()) or ())
    return JobDecision(
        record_id=rec.id,
        job_id=rec.job_id,
        job_name=rec.job_name,
        namespace=rec.namespace,
        created_at=rec.created_at,
        chosen=chosen,
        runner_up=runner,
        margin_usd=margin,
        why=_why(rec, chosen, runner),
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
) -> Report:
    """The placement report of ``records`` (``DecisionRecord`` rows, in any order).

    ``whatif_catalogs`` is where recorded catalog versions are loaded from for the what-if
    section: a ``pricing.CatalogStore`` (anything with ``.load(version)``) or a callable
    ``version -> Catalog``; ``None`` leaves the what-if section ``unavailable`` with the reason.
    ``egress`` (an ``EgressModel``) and ``place_fn`` (``policies.placement.place``) default to the
    project's own when importable. ``exclude_providers`` are the providers the "provider excluded"
    scenarios drop (default: the provider with the highest spend). At most ``whatif_max_jobs``
    jobs are re-placed per scenario (an evenly spread sample). Pure apart from the catalog loads.
    """
    with no_gc():
        return _build(records, whatif_catalogs, egress, place_fn, exclude_providers, whatif_max_jobs, filters,
                      generated_at)


def _build(
    records: Iterable[Any],
    whatif_catalogs: Any,
    egress: Any,
    place_fn: Callable[..., Any] | None,
    exclude_providers: Sequence[str] | None,
    whatif_max_jobs: int,
    filters: ReportFilters | None,
    generated_at: datetime | None,
) -> Report:
    recs = [to_rec(r) for r in records]
    counted, previews = _counted(recs)
    placed = [r for r in counted if r.chosen is not None]
    unplaced = len(counted) - len(placed)

    est = comp = egr = moved_gib = actual = est_fin = 0.0
    finished = 0
    considered = sum(r.considered for r in counted)
    routes: dict[tuple[str, str], list[float]] = {}
    daily: dict[str, list[float]] = {}
    for r in placed:
        c = r.chosen
        assert c is not None
        total = float(c["total_usd"])
        est += total
        comp += float(c["compute_usd"])
        e_usd = float(c["egress_usd"])
        egr += e_usd
        if r.actual_cost_usd is not None:
            finished += 1
            actual += r.actual_cost_usd
            est_fin += total
        moved = _moved_inputs(r)
        gib_sum = sum(g for _, g in moved)
        moved_gib += gib_sum
        dest = f"{c['provider']}:{c['region']}"
        for src, gib in moved:
            row = routes.setdefault((src, dest), [0.0, 0.0, 0])
            row[0] += gib
            row[1] += e_usd * gib / gib_sum if gib_sum > 0 else 0.0
            row[2] += 1
        day = daily.setdefault(r.created_at.date().isoformat(), [0, 0.0])
        day[0] += 1
        day[1] += total

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
    )
    egress_rows = sorted(
        (EgressRow(s, d, v[0], v[1], int(v[2])) for (s, d), v in routes.items()),
        key=lambda e: (-e.usd, -e.gib, e.source, e.destination),
    )

    # deadlines
    with_deadline = [r for r in placed if r.deadline is not None]
    decisions = tuple(_decision(r) for r in counted)
    dl_decisions = [d for d in decisions if d.deadline is not None and d.chosen is not None]

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
        jobs_with_deadline=len(with_deadline),
        met_predicted=sum(1 for d in dl_decisions if d.deadline_met_predicted),
        finished=sum(1 for d in dl_decisions if d.deadline_met is not None),
        met=sum(1 for d in dl_decisions if d.deadline_met is True),
        missed=sum(1 for d in dl_decisions if d.deadline_met is False),
        cost_usd=sum(float(r.chosen["total_usd"]) for r in with_deadline if r.chosen is not None),
        offers_too_slow=sum(
            v for r in with_deadline for k, v in r.rejected.items() if "deadline" in k.lower()
        ),
        premium_usd=premium,
        premium_note=premium_note,
    )

    def cap_key(r: Rec) -> str:
        assert r.chosen is not None
        return str(r.chosen.get("capacity", ""))

    return Report(
        generated_at=generated_at or datetime.now(UTC),
        filters=filters or ReportFilters(),
        summary=summary,
        baselines=_baselines(placed, est),
        by_provider=_spend(placed, lambda r: str(r.chosen["provider"]) if r.chosen else ""),
        by_region=_spend(placed, lambda r: f"{r.chosen['provider']}:{r.chosen['region']}" if r.chosen else ""),
        by_namespace=_spend(placed, lambda r: r.namespace or "-"),
        by_capacity=_spend(placed, cap_key),
        egress=tuple(egress_rows),
        decisions=decisions,
        deadlines=deadlines,
        whatif=whatif,
        daily=tuple(DailySpend(k, int(v[0]), v[1]) for k, v in sorted(daily.items())),
        catalog_versions=tuple(sorted({r.catalog_version for r in counted if r.catalog_version})),
    )

