"""Money budgets: hard holds with BudgetExceeded, soft admits with an alert, burn and projection."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.errors import SpecError
from policies.admission import PolicySnapshot, admit_in_order
from policies.budget import Budget, SpendEntry, budget_alerts, burn, check_budget, parse_budget
from tests.policies.builders import make_workload

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
YESTERDAY = datetime(2026, 3, 9, 23, 0, tzinfo=UTC)
LAST_MONTH = datetime(2026, 2, 27, 10, 0, tzinfo=UTC)

DAILY = Budget("b", "team-a", daily_usd=100.0)
MONTHLY = Budget("b", "team-a", monthly_usd=1000.0)


def spent(usd: float, at: datetime = NOW, ns: str = "team-a") -> SpendEntry:
    return SpendEntry(ns, usd, at)


@pytest.mark.parametrize(
    ("budgets", "entries", "cost", "held"),
    [
        ([DAILY], [spent(90)], 10.0, False),
        ([DAILY], [spent(90)], 10.01, True),
        ([DAILY], [spent(95, YESTERDAY)], 50.0, False),
        ([DAILY], [spent(90, ns="team-b")], 50.0, False),
        ([MONTHLY], [spent(900, YESTERDAY)], 150.0, True),
        ([MONTHLY], [spent(900, LAST_MONTH)], 150.0, False),
        ([Budget("b", "team-a", daily_usd=100.0, enforcement="soft")], [spent(99)], 50.0, False),
        ([DAILY], [spent(90), spent(-20)], 25.0, False),
        ([DAILY], [], 150.0, True),
        ([DAILY], [spent(120)], 0.0, False),
    ],
    ids=[
        "reaching the daily limit exactly admits",
        "a cent over the daily limit holds",
        "yesterday's spend does not count today",
        "another namespace's spend does not count",
        "the monthly limit counts earlier days",
        "last month's spend does not count",
        "a soft budget never holds",
        "refunds lower the spend",
        "a job dearer than the whole budget holds",
        "a job that costs nothing (dry-run, owned host) is not held even over the budget",
    ],
)
def test_hard_budgets_hold(budgets: list, entries: list, cost: float, held: bool) -> None:
    reason = check_budget(make_workload(estimated_usd=cost), budgets, entries, NOW)
    assert (reason is not None) is held
    if held:
        assert reason is not None and reason.startswith("BudgetExceeded: ")


def test_budget_crossed_mid_burst_admits_exactly_up_to_the_limit() -> None:
    snap = PolicySnapshot(now=NOW, budgets=(DAILY,), spend=(spent(40),))
    burst = [make_workload(f"j{i}", estimated_usd=15.0) for i in range(6)]
    results, after = admit_in_order(burst, snap)
    assert [r.admitted for r in results] == [True, True, True, True, False, False]
    assert results[4].reason is not None and "spent $100.00 of $100.00, job costs $15.00" in results[4].reason
    assert sum(e.usd for e in after.spend) == pytest.approx(100.0)


def test_soft_budget_admits_and_raises_an_alert() -> None:
    soft = Budget("b", "team-a", daily_usd=20.0, enforcement="soft")
    snap = PolicySnapshot(now=NOW, budgets=(soft,))
    results, _ = admit_in_order([make_workload("a", estimated_usd=15), make_workload("b", estimated_usd=15)], snap)
    assert [r.admitted for r in results] == [True, True]
    assert results[0].alerts == ()
    assert len(results[1].alerts) == 1 and results[1].alerts[0].startswith("BudgetAlert: daily budget of team-a")
    assert budget_alerts(make_workload(estimated_usd=1), [DAILY], [], NOW) == []


def test_burn_and_projection() -> None:
    entries = [spent(100, datetime(2026, 3, 1, 1, tzinfo=UTC)), spent(80, datetime(2026, 3, 5, tzinfo=UTC)),
               spent(20, NOW), spent(999, LAST_MONTH)]
    b = burn("team-a", entries, NOW, MONTHLY)
    assert b.today_usd == pytest.approx(20)
    assert b.month_usd == pytest.approx(200)
    elapsed_days = 9.5
    assert b.daily_rate_usd == pytest.approx(200 / elapsed_days)
    assert b.projected_month_usd == pytest.approx(200 / elapsed_days * 31)
    assert b.to_dict()["monthly_limit_usd"] == 1000.0
    early = burn("team-a", [spent(10, datetime(2026, 3, 1, 0, 30, tzinfo=UTC))],
                 datetime(2026, 3, 1, 1, tzinfo=UTC))
    assert early.projected_month_usd == pytest.approx(10 + 10 * (31 - 1 / 24))


@pytest.mark.parametrize(
    ("spec", "field"),
    [({}, "spec"), ({"dailyUSD": -1}, "spec.dailyUSD"), ({"monthlyUSD": "lots"}, "spec.monthlyUSD"),
     ({"dailyUSD": 1, "enforcement": "strict"}, "spec.enforcement")],
    ids=["no limits at all", "negative dollars", "not a number", "unknown enforcement"],
)
def test_bad_budget_documents_name_the_field(spec: dict, field: str) -> None:
    doc = {"apiVersion": "hybrid-broker/v1", "kind": "Budget", "metadata": {"namespace": "team-a"}, "spec": spec}
    with pytest.raises(SpecError) as err:
        parse_budget(doc)
    assert err.value.field == field


def test_budget_document_round_trip() -> None:
    b = parse_budget({"kind": "Budget", "metadata": {"name": "m", "namespace": "team-a"},
                      "spec": {"dailyUSD": "12.5", "monthlyUSD": 300, "enforcement": "soft"}})
    assert b == Budget("m", "team-a", 12.5, 300.0, "soft")
