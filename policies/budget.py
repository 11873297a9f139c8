"""Money budgets per namespace: dollars per UTC day and per UTC month.

A document::

    apiVersion: hybrid-broker/v1
    kind: Budget
    metadata: {name: team-a-money, namespace: team-a}
    spec:
      dailyUSD: 100          # either or both
      monthlyUSD: 2000
      enforcement: hard      # hard: hold with BudgetExceeded | soft: admit and raise an alert

At admission a job is charged its priced estimate (``Workload.estimated_usd``); a job that costs nothing
(an owned host, a dry-run provider that only simulates it) is never held nor alerted by a money budget.
The spend it is checked against is the namespace's ledger (:class:`SpendEntry`: one per admitted job,
plus corrections when runs end) within the current day and month, so a burst crossing the budget is cut
exactly where the next job would go over: jobs admitted earlier in the same cycle are in the ledger already.

Burn (:func:`burn`): spend today, month to date, and the projected month-end spend, which extrapolates
the month-to-date average daily rate (over at least one day) to the end of the month.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from broker.errors import SpecError
from policies.workload import Workload

__all__ = [
    "REASON",
    "ALERT",
    "HARD",
    "SOFT",
    "Budget",
    "SpendEntry",
    "Burn",
    "parse_budget",
    "burn",
    "check_budget",
    "budget_alerts",
]

REASON = "BudgetExceeded"
ALERT = "BudgetAlert"
HARD = "hard"
SOFT = "soft"


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits in USD for one ``namespace``; ``None`` = no limit for that period."""

    name: str
    namespace: str
    daily_usd: float | None = None
    monthly_usd: float | None = None
    enforcement: str = HARD


@dataclass(frozen=True, slots=True)
class SpendEntry:
    """``usd`` charged to ``namespace`` at ``at`` (UTC) for ``job_id`` (negative = a refund)."""

    namespace: str
    usd: float
    at: datetime
    job_id: str = ""


@dataclass(frozen=True, slots=True)
class Burn:
    """Spend of one namespace as of ``now``: ``today_usd`` (UTC day), ``month_usd`` (month to date),
    ``daily_rate_usd`` (month-to-date average per day) and ``projected_month_usd``; ``dry_run_*`` is the
    simulated spend of its dry-run jobs, kept apart (the caller fills it in)."""

    namespace: str
    now: datetime
    today_usd: float
    month_usd: float
    daily_rate_usd: float
    projected_month_usd: float
    daily_limit_usd: float | None = None
    monthly_limit_usd: float | None = None
    enforcement: str | None = None
    dry_run_today_usd: float = 0.0  # simulated spend of dry-run jobs: apart, in no limit nor projection
    dry_run_month_usd: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "now": self.now.isoformat(),
            "today_usd": round(self.today_usd, 6),
            "month_usd": round(self.month_usd, 6),
            "daily_rate_usd": round(self.daily_rate_usd, 6),
            "projected_month_usd": round(self.projected_month_usd, 6),
            "daily_limit_usd": self.daily_limit_usd,
            "monthly_limit_usd": self.monthly_limit_usd,
            "enforcement": self.enforcement,
            "dry_run_today_usd": round(self.dry_run_today_usd, 6),
            "dry_run_month_usd": round(self.dry_run_month_usd, 6),
        }


def _usd(value: object, path: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SpecError(path, f"expected dollars, got {value!r}")
    try:
        amount = float(value)
    except ValueError:
        raise SpecError(path, f"expected dollars, got {value!r}. To fix: e.g. 100 or '250.50'") from None
    if amount < 0:
        raise SpecError(path, f"{value!r} is negative")
    return amount


def parse_budget(doc: Mapping[str, Any], *, namespace: str | None = None) -> Budget:
    """Validate a ``Budget`` document. Raises :class:`SpecError` naming the field."""
    if doc.get("kind") != "Budget":
        raise SpecError("kind", f"expected Budget, got {doc.get('kind')!r}")
    meta = doc.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise SpecError("metadata", "expected a mapping")
    ns = meta.get("namespace") or namespace
    if not isinstance(ns, str) or not ns:
        raise SpecError("metadata.namespace", "a Budget needs a namespace")
    name = meta.get("name") or ns
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError("spec", "a Budget needs spec.dailyUSD and/or spec.monthlyUSD")
    daily = _usd(spec.get("dailyUSD"), "spec.dailyUSD")
    monthly = _usd(spec.get("monthlyUSD"), "spec.monthlyUSD")
    if daily is None and monthly is None:
        raise SpecError("spec", "set spec.dailyUSD and/or spec.monthlyUSD")
    enforcement = spec.get("enforcement", HARD)
    if enforcement not in (HARD, SOFT):
        raise SpecError("spec.enforcement", f"{enforcement!r} is not hard or soft")
    return Budget(str(name), ns, daily, monthly, enforcement)


def _day_start(now: datetime) -> datetime:
    now = now.astimezone(UTC)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def _month_start(now: datetime) -> datetime:
    return _day_start(now).replace(day=1)


def _spent(entries: Iterable[SpendEntry], namespace: str, since: datetime, now: datetime) -> float:
    return sum(e.usd for e in entries if e.namespace == namespace and since <= e.at <= now)


def burn(namespace: str, entries: Iterable[SpendEntry], now: datetime, budget: Budget | None = None) -> Burn:
    """Current burn and projected month-end spend of ``namespace`` (see the module docstring)."""
    items = list(entries)
    month0 = _month_start(now)
    today = _spent(items, namespace, _day_start(now), now)
    month = _spent(items, namespace, month0, now)
    days_in_month = calendar.monthrange(month0.year, month0.month)[1]
    elapsed_days = (now - month0) / timedelta(days=1)
    rate = month / max(1.0, elapsed_days)
    projected = month + rate * max(0.0, days_in_month - elapsed_days)
    return Burn(
        namespace, now, today, month, rate, projected,
        budget.daily_usd if budget else None,
        budget.monthly_usd if budget else None,
        budget.enforcement if budget else None,
    )


def _over(w: Workload, budget: Budget, entries: Sequence[SpendEntry], now: datetime) -> str | None:
    if w.estimated_usd <= 0:  # costs nothing (owned host, dry-run provider): a money budget has no say
        return None
    b = burn(w.namespace, entries, now, budget)
    for period, limit, spent, resets in (
        ("daily", budget.daily_usd, b.today_usd, _day_start(now) + timedelta(days=1)),
        ("monthly", budget.monthly_usd, b.month_usd, None),
    ):
        if limit is None or spent + w.estimated_usd <= limit + 1e-9:
            continue
        if resets is None:
            m0 = _month_start(now)
            resets = (m0 + timedelta(days=calendar.monthrange(m0.year, m0.month)[1]))
        return (
            f"{period} budget of {w.namespace} spent ${spent:.2f} of ${limit:.2f}, "
            f"job costs ${w.estimated_usd:.2f}; resets {resets:%Y-%m-%dT%H:%MZ}"
        )
    return None


def check_budget(
    w: Workload, budgets: Sequence[Budget], entries: Sequence[SpendEntry], now: datetime
) -> str | None:
    """``None`` when ``w``'s estimate fits the hard budgets of its namespace (soft budgets never hold),
    else ``BudgetExceeded: daily budget of team-a spent $95.00 of $100.00, job costs $10.00; ...``."""
    for budget in sorted(budgets, key=lambda b: b.name):
        if budget.namespace != w.namespace or budget.enforcement != HARD:
            continue
        why = _over(w, budget, entries, now)
        if why is not None:
            return f"{REASON}: {why}. To fix: raise the budget, wait for the reset or make the job cheaper"
    return None


def budget_alerts(
    w: Workload, budgets: Sequence[Budget], entries: Sequence[SpendEntry], now: datetime
) -> list[str]:
    """Alerts raised by admitting ``w`` over a soft budget (``BudgetAlert: ...``); empty when none."""
    out = []
    for budget in sorted(budgets, key=lambda b: b.name):
        if budget.namespace != w.namespace or budget.enforcement != SOFT:
            continue
        why = _over(w, budget, entries, now)
        if why is not None:
            out.append(f"{ALERT}: {why} (soft budget: admitted anyway)")
    return out
