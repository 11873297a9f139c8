"""Queue orderings: each discipline's key, its tie-breaks, and dominant-resource fair share."""

from __future__ import annotations

import math

import pytest

from policies import queueing as q
from policies.queueing import DominantShare, FairShareUsage, UsageVector, dominant_share
from tests.policies.builders import at, make_workload

W = make_workload


@pytest.mark.parametrize(
    ("discipline", "jobs", "expected"),
    [
        (q.FIFO, [W("b", created=5), W("a", created=1)], ["a", "b"]),
        (q.FIFO, [W("b", created=1, priority=100), W("a", created=1)], ["a", "b"]),
        (q.PRIORITY, [W("a", created=1, priority=1), W("b", created=5, priority=9)], ["b", "a"]),
        (q.PRIORITY, [W("b", created=2, priority=5), W("a", created=3, priority=5)], ["b", "a"]),
        (q.PRIORITY, [W("b", created=2, priority=5), W("a", created=2, priority=5)], ["a", "b"]),
        (q.PRIORITY, [W("n", created=0, priority=-5), W("z", created=9)], ["z", "n"]),
        (q.EDF, [W("a", deadline=at(900)), W("b", deadline=at(100))], ["b", "a"]),
        (q.EDF, [W("nodl", created=0), W("dl", created=9, deadline=at(10**6))], ["dl", "nodl"]),
        (q.EDF, [W("a", deadline=at(50), priority=1), W("b", deadline=at(50), priority=2)], ["b", "a"]),
        (q.EDF, [W("b", deadline=at(50)), W("a", deadline=at(50))], ["a", "b"]),
    ],
    ids=[
        "fifo serves the older job first",
        "fifo ignores priority and breaks equal times by id",
        "priority serves the higher priority first even if newer",
        "priority then fifo among equal priorities",
        "equal priority and equal time fall back to the id",
        "negative priorities sort after the default 0",
        "edf serves the earlier deadline first",
        "edf puts jobs without a deadline last",
        "edf breaks equal deadlines by priority",
        "edf breaks fully equal keys by id",
    ],
)
def test_orderings(discipline: str, jobs: list, expected: list[str]) -> None:
    assert [j.id for j in q.order(jobs, discipline)] == expected
    assert [j.id for j in q.order(list(reversed(jobs)), discipline)] == expected


def test_default_queue_key_reads_priority_then_deadline_then_age_from_mappings_too() -> None:
    rows = [
        {"id": "c", "priority": 1, "created_at": at(0)},
        {"id": "b", "priority": 1, "created_at": at(5), "deadline": at(60)},
        {"id": "a", "priority": 7, "created_at": at(9)},
    ]
    assert [r["id"] for r in sorted(rows, key=q.queue_key)] == ["a", "b", "c"]


TOTALS = UsageVector(cpu_hours=100, memory_gib_hours=400, gpu_hours=10, usd=1000)


@pytest.mark.parametrize(
    ("usage", "weight", "weighted", "resource"),
    [
        (UsageVector(cpu_hours=50), 1.0, 0.5, "cpu"),
        (UsageVector(cpu_hours=10, gpu_hours=5), 1.0, 0.5, "gpu"),
        (UsageVector(usd=900, cpu_hours=1), 2.0, 0.45, "usd"),
        (UsageVector(), 1.0, 0.0, ""),
        (UsageVector(cpu_hours=10), 0.0, math.inf, "cpu"),
        (UsageVector(), 0.0, 0.0, ""),
    ],
    ids=[
        "cpu dominates when it is the only use",
        "the largest fraction wins, here gpu",
        "dollars count as a resource and weight 2 halves the share",
        "no usage is share zero",
        "zero weight with usage is infinite",
        "zero weight without usage is zero but still flagged",
    ],
)
def test_dominant_share(usage: UsageVector, weight: float, weighted: float, resource: str) -> None:
    share = dominant_share(usage, TOTALS, weight)
    assert share.weighted == pytest.approx(weighted)
    assert share.resource == resource
    assert share.zero_weight is (weight == 0)


def test_zero_weight_namespaces_sort_after_every_weighted_one_even_a_heavy_user() -> None:
    heavy = dominant_share(UsageVector(cpu_hours=99), TOTALS, 1.0)
    idle_zero = dominant_share(UsageVector(), TOTALS, 0.0)
    used_zero = dominant_share(UsageVector(cpu_hours=1), TOTALS, 0.0)
    assert sorted([used_zero, idle_zero, heavy]) == [heavy, idle_zero, used_zero]
    assert DominantShare(0.2, 0.2) == DominantShare(0.2, 0.2)
    with pytest.raises(ValueError, match="negative"):
        dominant_share(UsageVector(), TOTALS, -1)


def test_fair_share_orders_by_namespace_share_then_priority() -> None:
    usage = FairShareUsage(half_life_seconds=3600).add("team-a", UsageVector(cpu_hours=60), at(0))
    usage = usage.add("team-b", UsageVector(cpu_hours=20), at(0))
    shares = usage.shares(TOTALS, {"team-a": 1.0, "team-b": 1.0}, at(0))
    jobs = [W("a1", namespace="team-a", priority=100), W("b1", namespace="team-b"), W("c1", namespace="team-c")]
    assert [j.id for j in q.order(jobs, q.FAIR_SHARE, shares=shares)] == ["c1", "b1", "a1"]
    weighted = usage.shares(TOTALS, {"team-a": 4.0, "team-b": 1.0}, at(0))
    assert [j.id for j in q.order(jobs[:2], q.FAIR_SHARE, shares=weighted)] == ["a1", "b1"]


@pytest.mark.parametrize(
    ("half_life", "elapsed", "remaining"),
    [(3600, 0, 60.0), (3600, 3600, 30.0), (3600, 7200, 15.0), (0, 1, 0.0), (math.inf, 10**9, 60.0)],
    ids=["no time passed", "one half-life halves usage", "two half-lives quarter it",
         "zero half-life forgets at once", "infinite half-life never forgets"],
)
def test_usage_decays_with_the_half_life(half_life: float, elapsed: float, remaining: float) -> None:
    usage = FairShareUsage(half_life_seconds=half_life).add("ns", UsageVector(cpu_hours=60), at(0))
    assert usage.usage("ns", at(elapsed)).cpu_hours == pytest.approx(remaining)
    assert usage.usage("other", at(elapsed)) == UsageVector()


def test_unknown_discipline_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="To fix: use one of fifo"):
        q.key_for("lifo")
