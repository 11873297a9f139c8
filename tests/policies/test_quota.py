"""ResourceQuota documents and their enforcement, including cohorts with borrowing limits."""

from __future__ import annotations

import pytest

from broker.errors import SpecError
from policies.quota import check_quota, parse_resource_quota, quota_status
from tests.policies.builders import make_workload


def quota_doc(ns: str = "team-a", name: str = "q", **spec: object) -> dict:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": ns},
            "spec": spec}


def running(n: int, *, cpu: float, ns: str = "team-a", **kw: object) -> list:
    return [make_workload(f"{ns}-r{i}", namespace=ns, cpu=cpu, **kw) for i in range(n)]


CPU100 = parse_resource_quota(quota_doc(hard={"requests.cpu": "100"}))


@pytest.mark.parametrize(
    ("quotas", "admitted", "job", "expected"),
    [
        ([CPU100], running(12, cpu=8), make_workload(cpu=4), None),
        ([CPU100], running(12, cpu=8), make_workload(cpu=8),
         "QuotaExceeded: requests.cpu 96/100, job needs 8 (quota team-a/q)"),
        ([CPU100], running(10, cpu=10), make_workload(cpu=0.5), "QuotaExceeded: requests.cpu 100/100, job needs 0.5"),
        ([CPU100], running(12, cpu=8, ns="team-b"), make_workload(cpu=8), None),
        ([CPU100], running(12, cpu=8), make_workload(cpu=8, namespace="team-b"), None),
        ([parse_resource_quota(quota_doc(hard={"requests.memory": "64Gi"}))], running(1, cpu=1, memory=60),
         make_workload(memory=8), "QuotaExceeded: requests.memory 60Gi/64Gi, job needs 8Gi"),
        ([parse_resource_quota(quota_doc(hard={"limits.nvidia.com/gpu": 2}))], running(1, cpu=1, gpus=2),
         make_workload(gpus=1), "QuotaExceeded: limits.nvidia.com/gpu 2/2, job needs 1"),
        ([parse_resource_quota(quota_doc(hard={"count/jobs": 3}))], running(3, cpu=1), make_workload(),
         "QuotaExceeded: count/jobs 3/3, job needs 1"),
        ([parse_resource_quota(quota_doc(hard={"cpu": 16}))], [], make_workload(cpu=4, nodes=4), None),
        ([parse_resource_quota(quota_doc(hard={"cpu": 16}))], [], make_workload(cpu=4, nodes=5),
         "QuotaExceeded: requests.cpu 0/16, job needs 20"),
        ([parse_resource_quota(quota_doc(hard={"limits.cpu": 8}))], [],
         make_workload(cpu=2, limits={"cpu": 12}), "QuotaExceeded: limits.cpu 0/8, job needs 12"),
    ],
    ids=[
        "room left admits",
        "the issue's example: 96 of 100 used and 8 needed holds",
        "quota exactly full admits nothing more, even half a core",
        "other namespaces' usage does not count",
        "a namespace without a quota is unlimited",
        "memory quotas compare GiB and say Gi",
        "gpu limits count the job's gpus",
        "count/jobs counts admitted jobs",
        "a gang that fills the quota exactly is admitted",
        "gangs count every node",
        "limits.cpu reads the limit, not the request",
    ],
)
def test_quota_enforcement(quotas: list, admitted: list, job: object, expected: str | None) -> None:
    reason = check_quota(job, quotas, admitted)  # type: ignore[arg-type]
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(expected), reason


def cohort(ns: str, cpu: float, borrow: float | None = None) -> object:
    spec: dict = {"hard": {"requests.cpu": cpu}, "cohort": "research"}
    if borrow is not None:
        spec["borrowingLimit"] = {"requests.cpu": borrow}
    return parse_resource_quota(quota_doc(ns=ns, **spec))


@pytest.mark.parametrize(
    ("quotas", "admitted", "job", "held_because"),
    [
        ([cohort("team-a", 10), cohort("team-b", 10)], running(1, cpu=10), make_workload(cpu=5), None),
        ([cohort("team-a", 10, borrow=4), cohort("team-b", 10)], running(1, cpu=10), make_workload(cpu=5),
         "above the borrowingLimit 4"),
        ([cohort("team-a", 10, borrow=5), cohort("team-b", 10)], running(1, cpu=10), make_workload(cpu=5), None),
        ([cohort("team-a", 10), cohort("team-b", 10)], running(1, cpu=10) + running(1, cpu=8, ns="team-b"),
         make_workload(cpu=5), "nothing left to borrow"),
    ],
    ids=[
        "a full namespace borrows the cohort's unused quota",
        "borrowing beyond the borrowing limit holds",
        "borrowing exactly up to the limit admits",
        "a busy cohort has nothing left to lend",
    ],
)
def test_cohort_borrowing(quotas: list, admitted: list, job: object, held_because: str | None) -> None:
    reason = check_quota(job, quotas, admitted)  # type: ignore[arg-type]
    assert (reason is None) if held_because is None else (reason is not None and held_because in reason), reason


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"kind": "Quota"}, "kind"),
        (quota_doc(hard={"requests.cpu": "lots"}), "spec.hard.requests.cpu"),
        (quota_doc(hard={"requests.storage": "1"}), "spec.hard.requests.storage"),
        (quota_doc(hard={}), "spec.hard"),
        (quota_doc(hard={"count/jobs": "1.5"}), "spec.hard.count/jobs"),
        (quota_doc(hard={"requests.memory": 64}), "spec.hard.requests.memory"),
        (quota_doc(hard={"cpu": 1}, borrowingLimit={"cpu": 1}), "spec.borrowingLimit"),
        ({"kind": "ResourceQuota", "metadata": {"name": "q"}, "spec": {"hard": {"cpu": 1}}}, "metadata.namespace"),
    ],
    ids=["wrong kind", "not a quantity", "unsupported key", "empty hard", "fractional job count",
         "bare memory number means bytes", "borrowing without a cohort", "no namespace"],
)
def test_bad_quota_documents_name_the_field(doc: dict, field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_resource_quota(doc)
    assert err.value.field == field


def test_quota_status_reports_used_and_hard() -> None:
    q = parse_resource_quota(quota_doc(hard={"requests.cpu": "100", "requests.memory": "1Ti", "count/jobs": 5}))
    lines = {line.key: (line.used, line.hard) for line in quota_status(q, running(3, cpu=8))}
    assert lines == {"requests.cpu": (24, 100), "requests.memory": (6, 1024), "count/jobs": (3, 5)}
