"""PriorityClass documents and resolution; QoS classes as Kubernetes derives them."""

from __future__ import annotations

import pytest

from broker.errors import ConflictError, SpecError
from policies.admission import PolicySnapshot, admit, with_resolved_priority
from policies.priority import (
    PriorityClass,
    ResolvedPriority,
    check_single_global_default,
    parse_priority_class,
    resolve,
)
from policies.qos import QoSClass, qos_class, qos_rank
from tests.policies.builders import T0, make_workload

HIGH = PriorityClass("high", 1000)
LOW = PriorityClass("low", 10, global_default=True)
NEVER = PriorityClass("polite", 5000, preemption_policy="Never")
CLASSES = {c.name: c for c in (HIGH, LOW, NEVER)}


@pytest.mark.parametrize(
    ("name", "classes", "explicit", "expected"),
    [
        ("high", CLASSES, None, ResolvedPriority(1000, "PreemptLowerPriority", "high")),
        ("polite", CLASSES, None, ResolvedPriority(5000, "Never", "polite")),
        (None, CLASSES, None, ResolvedPriority(10, "PreemptLowerPriority", "low")),
        (None, {"high": HIGH}, None, ResolvedPriority(0)),
        (None, CLASSES, 77, ResolvedPriority(77)),
        ("high", CLASSES, 77, ResolvedPriority(1000, "PreemptLowerPriority", "high")),
    ],
    ids=[
        "a named class gives its value",
        "a class carries its preemption policy",
        "no name takes the global default",
        "no name and no global default is zero",
        "a raw priority is used without a class",
        "a class wins over a raw priority",
    ],
)
def test_resolve(name: str | None, classes: dict, explicit: int | None, expected: ResolvedPriority) -> None:
    assert resolve(name, classes, explicit=explicit) == expected


def test_unknown_class_holds_the_job_with_a_readable_reason() -> None:
    reason = resolve("urgent", CLASSES)
    assert isinstance(reason, str) and reason.startswith("PriorityClassNotFound: priorityClassName 'urgent'")
    result = admit(make_workload(priority_class="urgent"), PolicySnapshot(now=T0, priority_classes=CLASSES))
    assert not result.admitted and result.reason is not None and "known: high, low, polite" in result.reason
    resolved = with_resolved_priority(make_workload(priority_class="high"), CLASSES)
    assert resolved.priority == 1000


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"kind": "PriorityClass", "metadata": {"name": "x"}, "value": "1"}, "value"),
        ({"kind": "PriorityClass", "metadata": {"name": "x"}, "value": 2_000_000_000}, "value"),
        ({"kind": "PriorityClass", "metadata": {"name": "x"}, "value": 1, "preemptionPolicy": "Sometimes"},
         "preemptionPolicy"),
        ({"kind": "PriorityClass", "metadata": {}, "value": 1}, "metadata.name"),
        ({"kind": "PriorityClass", "metadata": {"name": "x"}, "value": 1, "globalDefault": "yes"}, "globalDefault"),
    ],
    ids=["value must be an integer", "values above one billion are the system's", "unknown preemption policy",
         "a class needs a name", "globalDefault is a boolean"],
)
def test_bad_priority_class_documents(doc: dict, field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_priority_class(doc)
    assert err.value.field == field


def test_only_one_global_default() -> None:
    parsed = parse_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                   "metadata": {"name": "d"}, "value": 1, "globalDefault": True})
    check_single_global_default([parsed, HIGH])
    with pytest.raises(ConflictError, match="d, low are all globalDefault"):
        check_single_global_default([parsed, LOW])


@pytest.mark.parametrize(
    ("requests", "limits", "expected"),
    [
        ({"cpu": 2, "memory": 4}, {"cpu": 2, "memory": 4}, QoSClass.GUARANTEED),
        ({}, {"cpu": 2, "memory": 4}, QoSClass.GUARANTEED),
        ({"cpu": 1, "memory": 4}, {"cpu": 2, "memory": 4}, QoSClass.BURSTABLE),
        ({"cpu": 2}, {"cpu": 2}, QoSClass.BURSTABLE),
        ({"cpu": 2, "memory": 4}, {}, QoSClass.BURSTABLE),
        ({}, {}, QoSClass.BEST_EFFORT),
        ({"gpu": 1}, {"gpu": 1}, QoSClass.BEST_EFFORT),
        ({"cpu": 2, "memory": 4, "gpu": 1}, {"cpu": 2, "memory": 4}, QoSClass.GUARANTEED),
        ({"cpu": 0}, {}, QoSClass.BEST_EFFORT),
    ],
    ids=[
        "requests equal to limits for cpu and memory is Guaranteed",
        "limits alone imply equal requests, so Guaranteed",
        "a request below its limit is Burstable",
        "a cpu limit without a memory limit is Burstable",
        "requests without limits is Burstable",
        "nothing at all is BestEffort",
        "gpus alone do not count, so BestEffort",
        "gpus do not spoil Guaranteed",
        "a zero request counts as unset",
    ],
)
def test_qos_class(requests: dict, limits: dict, expected: QoSClass) -> None:
    assert qos_class(requests, limits) is expected


def test_qos_rank_orders_victims_best_effort_first() -> None:
    assert sorted(QoSClass, key=qos_rank) == [QoSClass.BEST_EFFORT, QoSClass.BURSTABLE, QoSClass.GUARANTEED]
