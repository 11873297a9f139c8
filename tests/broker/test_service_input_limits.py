"""Issue 17, item 10: odd input is a clear 4xx on SQLite and PostgreSQL alike, never a 500 or a leak."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.errors import SpecError
from broker.spec import parse_job_spec
from tests.broker.service_support import ADMIN_H, job_doc, make_app, serve_in_thread


@pytest.mark.parametrize("doc, field", [
    (job_doc("nul-label", labels={"team": "a\x00b"}), "metadata.labels.team"),
    (job_doc("long-label", labels={"team": "x" * 64}), "metadata.labels.team"),
    (job_doc("nul-env", env={"A": "x\x00y"}), "spec.env.A"),
    (job_doc("nul-cmd", command=["echo", "a\x00"]), "spec.command[1]"),
    (job_doc("tiny-cpu", cpu=1e-30), "spec.resources.requests.cpu"),
])
def test_values_no_store_can_hold_are_refused_at_parse_time(doc: dict, field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_job_spec(doc)
    assert err.value.field == field


@pytest.fixture(scope="module")
def server(module_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One real server per store (SQLite, PostgreSQL) for the tests of this module, and its temp dir."""
    tmp = tmp_path_factory.mktemp("limits")
    with serve_in_thread(make_app(tmp, module_store_url)) as url:
        yield url, tmp


@pytest.mark.parametrize("doc, field", [
    (job_doc("nul-label", labels={"team": "a\x00b"}), "metadata.labels.team"),
    (job_doc("nul-label-key", labels={"te\x00am": "a"}), "metadata.labels"),
    (job_doc("long-label", labels={"team": "x" * 64}), "metadata.labels.team"),
    (job_doc("nul-env", env={"A": "x\x00y"}), "spec.env.A"),
    (job_doc("nul-cmd", command=["echo", "a\x00"]), "spec.command[1]"),
    (job_doc("tiny-cpu", cpu=1e-30), "spec.resources.requests.cpu"),
], ids=["a NUL in a label value", "a NUL in a label key", "a label value of 64 characters", "a NUL in env",
        "a NUL in the command", "cpu 1e-30"])
def test_odd_values_answer_422_over_http_on_both_stores(server: tuple[str, Path], doc: dict, field: str) -> None:
    with httpx.Client(base_url=server[0], timeout=30, headers=ADMIN_H) as client:
        r = client.post("/v1/namespaces/default/jobs", json=doc)
        listed = client.get("/v1/namespaces/default/jobs").json()["jobs"]
    assert r.status_code == 422 and r.json()["field"].startswith(field), r.text
    assert r.json()["detail"], "a message says what is wrong"
    assert doc["metadata"]["name"] not in [j["name"] for j in listed], "nothing stored"


def test_odd_requests_answer_4xx_with_json_and_never_leak(server: tuple[str, Path]) -> None:
    url, tmp_path = server
    nested = "[" * 100_000 + "]" * 100_000
    with httpx.Client(base_url=url, timeout=30) as client:
        deep = client.post("/v1/policies:apply", content=nested, headers=ADMIN_H | {"Content-Type": "application/json"})
        deep_job = client.post("/v1/namespaces/default/jobs", content=nested,
                               headers=ADMIN_H | {"Content-Type": "application/json"})
        deep_yaml = client.post("/v1/namespaces/default/jobs", content="[" * 10_000 + "]" * 10_000,
                                headers=ADMIN_H | {"Content-Type": "application/yaml"})
        since = client.get("/v1/reports/placements", params={"since": "99999999d"}, headers=ADMIN_H)
        since_ops = client.get("/v1/ops/metrics/jobs", params={"since": "99999999d"}, headers=ADMIN_H)
        label = client.post("/v1/namespaces/default/jobs", json=job_doc("l", labels={"k": "v" * 64}), headers=ADMIN_H)
        metrics = client.get("/metrics")
        enroll = client.post("/v1/edge/enroll", json={"token": "t" * 16, "csr_pem": "x" * 64})
    assert deep.status_code == 422 and "nested too deeply" in deep.json()["detail"]
    for r in (deep_job, deep_yaml):
        assert r.status_code == 422 and r.json()["detail"], r.text
    assert since.status_code == 422 and "out of range" in since.json()["detail"], since.text
    assert since_ops.status_code == 422 and since_ops.json()["detail"], since_ops.text
    assert label.status_code == 422 and label.json()["field"] == "metadata.labels.k"
    assert metrics.status_code == 401 and "default" not in metrics.text
    assert str(tmp_path) not in enroll.text, "an unauthenticated caller never learns the data directory"
