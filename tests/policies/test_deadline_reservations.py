"""Deadline feasibility (burst to a faster place, or reject at once) and on-prem reservations."""

from __future__ import annotations

from datetime import timedelta

import pytest

from policies.admission import PolicySnapshot, admit
from policies.deadline import choose_for_deadline, is_terminal
from policies.reservations import Reservation, check_reservation, usable_capacity
from policies.workload import Resources
from tests.policies.builders import T0, make_option, make_workload

CHEAP_SLOW = make_option("onprem", "rack-a", total=0.5, finish_hours=10, instance_type="host")
MID = make_option("aws", "us-east-1", total=4.0, finish_hours=3)
FAST = make_option("gcp", "us-central1", total=9.0, finish_hours=1)


@pytest.mark.parametrize(
    ("deadline_h", "wait", "chosen", "premium", "text"),
    [
        (None, 0.0, CHEAP_SLOW, 0.0, "no deadline"),
        (12, 0.0, CHEAP_SLOW, 0.0, "the cheapest option meets the deadline"),
        (5, 0.0, MID, 3.5, "meets the deadline for $3.50 more than the cheapest"),
        (2, 0.0, FAST, 8.5, "meets the deadline for $8.50 more than the cheapest"),
        (12, {"onprem": 4.0}, MID, 3.5, "meets the deadline for $3.50 more"),
        (0.5, 0.0, None, 0.0, "DeadlineInfeasible: no option finishes by"),
        (-1, 0.0, None, 0.0, "DeadlineInfeasible: the deadline"),
    ],
    ids=[
        "without a deadline the cheapest wins",
        "a generous deadline keeps the cheapest",
        "a tighter deadline bursts to the cloud and prices it",
        "a tight deadline takes the fastest",
        "queue wait on-prem counts against the deadline",
        "an impossible deadline is rejected with the fastest option's lateness",
        "a past deadline is rejected at once",
    ],
)
def test_choose_for_deadline(deadline_h: float | None, wait: object, chosen: object, premium: float,
                             text: str) -> None:
    deadline = None if deadline_h is None else T0 + timedelta(hours=deadline_h)
    d = choose_for_deadline([FAST, CHEAP_SLOW, MID], deadline=deadline, now=T0, wait_hours=wait)  # type: ignore[arg-type]
    assert d.option is chosen
    assert d.premium_usd == pytest.approx(premium)
    assert text in d.explanation
    assert is_terminal(d.explanation) is (chosen is None)


def test_infeasible_explanation_names_the_fastest_option_and_how_late() -> None:
    d = choose_for_deadline([FAST, MID], deadline=T0 + timedelta(minutes=30), now=T0)
    assert "gcp:us-central1" in d.explanation and "0.50 h late" in d.explanation


def test_past_deadline_fails_admission_at_once() -> None:
    result = admit(make_workload(deadline=T0 - timedelta(seconds=1)), PolicySnapshot(now=T0))
    assert not result.admitted and result.terminal


GPU_RES = Reservation("train", "onprem:rack-a", Resources(8, 32, 2), priority_class="high")
NS_RES = Reservation("ops", "onprem:rack-a", Resources(4, 8, 0), namespace="ops")
FREE = Resources(12, 64, 2)


@pytest.mark.parametrize(
    ("job", "running", "usable"),
    [
        (make_workload(), [], Resources(4, 32, 0)),
        (make_workload(priority_class="high"), [], Resources(12, 64, 2)),
        (make_workload(), [make_workload("h", priority_class="high", cpu=8, memory=32, gpus=2,
                                         host="onprem:rack-a")], Resources(12, 64, 2)),
        (make_workload(), [make_workload("h", priority_class="high", cpu=3, memory=2,
                                         host="onprem:rack-a")], Resources(7, 34, 0)),
        (make_workload(), [make_workload("h", priority_class="high", cpu=8, memory=32, gpus=2,
                                         host="onprem:rack-b")], Resources(4, 32, 0)),
    ],
    ids=[
        "others see free capacity minus the reservation",
        "holders see everything",
        "a reservation fully in use by its holders keeps nothing back",
        "the unused part of a reservation stays kept",
        "holders on another pool do not use this pool's reservation",
    ],
)
def test_usable_capacity(job: object, running: list, usable: Resources) -> None:
    assert usable_capacity(job, "onprem:rack-a", FREE, [GPU_RES], running) == usable  # type: ignore[arg-type]


def test_reservations_hold_on_prem_only_jobs_with_a_reason_and_let_holders_in() -> None:
    snap = PolicySnapshot(now=T0, reservations=(GPU_RES, NS_RES), pool_free={"onprem:rack-a": FREE})
    outsider = make_workload(cpu=2, providers=("onprem",))
    result = admit(outsider, snap)
    assert not result.admitted and result.reason is not None
    assert result.reason.startswith("ReservedCapacity: onprem:rack-a")
    assert "ops (for namespace ops)" in result.reason and "train (for priorityClass high)" in result.reason
    assert admit(make_workload(cpu=4, providers=("onprem",), namespace="ops"), snap).admitted
    assert not admit(make_workload(cpu=5, providers=("onprem",), namespace="ops"), snap).admitted
    assert admit(make_workload(cpu=6), snap).admitted  # may burst to the cloud: not held here
    assert check_reservation(make_workload(cpu=20), "onprem:rack-a", FREE, [GPU_RES], []) is None
