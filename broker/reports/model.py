"""The placement report as data: what :func:`broker.reports.build_report` returns and every
renderer (HTML, CSV, JSON) reads. Money is USD, data is GiB, times are timezone-aware UTC.

``Report.to_dict()`` is the JSON document described by ``docs/schemas/placement-report.schema.json``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = [
    "SCHEMA_ID",
    "ReportFilters",
    "Summary",
    "Baseline",
    "SpendRow",
    "EgressRow",
    "OptionView",
    "JobDecision",
    "DeadlineSummary",
    "WhatIf",
    "DailySpend",
    "Report",
]

SCHEMA_ID = "https://hybrid-broker.dev/schemas/placement-report/v1"


@dataclass(frozen=True, slots=True)
class ReportFilters:
    """The window and namespace a report covers (``None`` = open bound / every namespace)."""

    namespace: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Summary:
    """Totals over the placed jobs. ``actual_spend_usd`` sums only finished runs
    (``finished_jobs`` of them), whose estimate was ``estimated_finished_usd``. ``dry_run_usd`` is the part of
    the estimated spend of the ``dry_run_jobs`` jobs that ran in dry-run mode (simulated, nothing paid)."""

    jobs_placed: int
    previews: int
    unplaced: int
    estimated_spend_usd: float
    compute_usd: float
    egress_usd: float
    data_moved_gib: float
    finished_jobs: int
    actual_spend_usd: float
    estimated_finished_usd: float
    offers_considered: int
    first_at: datetime | None
    last_at: datetime | None
    # jobs whose run was simulated (a dry-run provider: no credentials), and their estimated spend
    dry_run_jobs: int = 0
    dry_run_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class Baseline:
    """What the same jobs would have cost under a simpler rule, priced at decision time.

    ``savings_usd = cost_usd - broker_usd``, where ``broker_usd`` is the broker's recorded cost of
    the jobs this baseline counts. ``exact_jobs`` counts the jobs priced (those whose decision
    stored this baseline; see docs/REPORTS.md) of ``jobs`` placed. ``detail`` names e.g. the region
    the baseline used and the jobs it could not count.
    """

    key: str
    label: str
    cost_usd: float
    broker_usd: float
    savings_usd: float
    savings_pct: float
    exact_jobs: int
    jobs: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class SpendRow:
    """Spend of the jobs sharing one ``key`` (a provider, ``provider:region``, namespace or capacity)."""

    key: str
    jobs: int
    estimated_usd: float
    compute_usd: float
    egress_usd: float
    actual_usd: float
    finished_jobs: int


@dataclass(frozen=True, slots=True)
class EgressRow:
    """Data moved from ``source`` to ``destination`` (location keys) and its cost. A job's egress is
    apportioned over its moved inputs by size."""

    source: str
    destination: str
    gib: float
    usd: float
    jobs: int


@dataclass(frozen=True, slots=True)
class OptionView:
    """One stored placement option (see :class:`broker.model.PlacementOption`)."""

    provider: str
    region: str
    instance_type: str
    capacity: str
    site: str
    hourly_usd: float
    compute_usd: float
    egress_usd: float
    transfer_hours: float
    total_usd: float
    finish_hours: float = 0.0

    @property
    def location(self) -> str:
        return f"{self.provider}:{self.region}"


@dataclass(frozen=True, slots=True)
class JobDecision:
    """One job's decision: the choice, the runner-up, and a sentence saying why the choice won.
    ``margin_usd = runner_up.total_usd - chosen.total_usd`` (negative when a faster, dearer
    option won because the objective was time)."""

    record_id: int | None
    job_id: str | None
    job_name: str
    namespace: str | None
    created_at: datetime
    chosen: OptionView | None
    runner_up: OptionView | None
    margin_usd: float | None
    why: str
    policy: str
    catalog_version: str
    considered: int
    feasible: int
    rejected: dict[str, int]
    data_gib: float
    deadline: datetime | None
    predicted_finish_at: datetime | None
    deadline_met_predicted: bool | None
    finished_at: datetime | None
    runtime_hours: float | None
    actual_cost_usd: float | None
    deadline_met: bool | None


@dataclass(frozen=True, slots=True)
class DeadlineSummary:
    """Deadline outcomes. ``premium_usd`` is what meeting the deadlines cost: the recorded cost of the
    deadline jobs minus their cost re-placed without deadlines (``None`` when the recorded catalogs
    were not available). ``offers_too_slow`` sums the offers rejected as missing a deadline."""

    jobs_with_deadline: int
    met_predicted: int
    finished: int
    met: int
    missed: int
    cost_usd: float
    offers_too_slow: int
    premium_usd: float | None
    premium_note: str


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The same jobs re-placed under another policy against their recorded catalog versions.

    ``status`` is ``ok`` or ``unavailable`` (``reason`` says why). ``jobs_replaced`` of ``jobs_total``
    were re-placed (a bounded, evenly spread sample when there are many); ``recorded_usd`` and
    ``whatif_usd`` compare those jobs only; ``moved`` counts jobs that would run elsewhere and
    ``unplaceable`` those with no feasible option under the policy."""

    key: str
    label: str
    status: str
    reason: str = ""
    jobs_total: int = 0
    jobs_replaced: int = 0
    recorded_usd: float = 0.0
    whatif_usd: float = 0.0
    delta_usd: float = 0.0
    moved: int = 0
    unplaceable: int = 0


@dataclass(frozen=True, slots=True)
class DailySpend:
    day: str  # ISO date, UTC
    jobs: int
    estimated_usd: float


@dataclass(frozen=True, slots=True)
class Report:
    """The whole placement report. ``decisions`` holds every placed or unplaceable job (the last
    placement of each job), oldest first: any sequence of :class:`JobDecision` (``build_report``
    gives a lazy one that builds each decision when it is read; see ``broker.reports.build.DecisionList``)."""

    generated_at: datetime
    filters: ReportFilters
    summary: Summary
    baselines: tuple[Baseline, ...]
    by_provider: tuple[SpendRow, ...]
    by_region: tuple[SpendRow, ...]
    by_namespace: tuple[SpendRow, ...]
    by_capacity: tuple[SpendRow, ...]
    egress: tuple[EgressRow, ...]
    decisions: Sequence[JobDecision]
    deadlines: DeadlineSummary
    whatif: tuple[WhatIf, ...]
    daily: tuple[DailySpend, ...]
    catalog_versions: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``docs/schemas/placement-report.schema.json`` (datetimes as ISO 8601)."""
        out: dict[str, Any] = {"schema": SCHEMA_ID}
        for name in _REPORT_FIELDS:
            value = getattr(self, name)
            out[name] = decision_dicts(value) if name == "decisions" else _plain(value)
        return out


def decision_dicts(decisions: Iterable[JobDecision]) -> list[dict[str, Any]]:
    """The JSON form of ``decisions``: their ``plain_dicts()`` when they have it (the lazy list
    ``build_report`` makes: no object per decision), else each decision converted."""
    plain = getattr(decisions, "plain_dicts", None)
    if plain is not None:
        return plain()  # type: ignore[no-any-return]
    return [_plain(d) for d in decisions]


_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    cls = type(value)
    if hasattr(cls, "__dataclass_fields__"):
        d = {name: _plain(getattr(value, name)) for name in _field_names(cls)}
        if isinstance(value, OptionView):
            d["location"] = value.location
        return d
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


_REPORT_FIELDS = tuple(f.name for f in dataclasses.fields(Report))
