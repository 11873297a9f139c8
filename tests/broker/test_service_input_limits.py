"""Issue 17, item 10: odd input is a clear 4xx on SQLite and PostgreSQL alike, never a 500 or a leak."""

from __future__ import annotations

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


def test_odd_requests_answer_4xx_with_json_and_never_leak(tmp_path: Path) -> None:
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'broker.db'}")  # the label limit: same on both stores now
    nested = "[" * 100_000 + "]" * 100_000
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        deep = client.post("/v1/policies:apply", content=nested, headers=ADMIN_H | {"Content-Type": "application/json"})
        since = client.get("/v1/reports/placements", params={"since": "99999999d"}, headers=ADMIN_H)
        label = client.post("/v1/namespaces/default/jobs", json=job_doc("l", labels={"k": "v" * 64}), headers=ADMIN_H)
        metrics = client.get("/metrics")
        enroll = client.post("/v1/edge/enroll", json={"token": "t" * 16, "csr_pem": "x" * 64})
    assert deep.status_code == 422 and "nested too deeply" in deep.json()["detail"]
    assert since.status_code == 422 and "out of range" in since.json()["detail"], since.text
    assert label.status_code == 422 and label.json()["field"] == "metadata.labels.k"
    assert metrics.status_code == 401 and "default" not in metrics.text
    assert str(tmp_path) not in enroll.text, "an unauthenticated caller never learns the data directory"
