"""Device labels for placement (issue 13): set at enrollment (the token's and the device's own), changed by
an admin (API, CLI), validated like Kubernetes labels, and selected by a job's ``placement.nodeSelector``.
The end-to-end case runs the broker under uvicorn, Mosquitto with mTLS from the generated config, and
agents enrolled over HTTP running as processes."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.errors import SpecError
from broker.spec import parse_job_spec, validate_labels
from tests.broker.service_support import ADMIN, ADMIN_H
from tests.edge.conftest import AgentProcess, wait_until
from tests.edge.test_edge_service import NS, Stack, _cli, _done, job_doc, stack  # noqa: F401 - fixture

BAD_LABELS = [({"-zone": "lab"}, "invalid label key"), ({"zone": "a b"}, "invalid label value"),
              ({"a/b/c": "x"}, "invalid label key"), ({"x" * 64: "v"}, "invalid label key"),
              ({"zone": "v" * 64}, "invalid label value"), ({f"k{i}": "v" for i in range(65)}, "at most 64")]


@pytest.mark.parametrize(("labels", "message"), BAD_LABELS)
def test_labels_are_validated_like_kubernetes_labels(labels: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        validate_labels(labels, "labels")


def test_valid_labels_pass_and_numbers_read_as_text() -> None:
    assert validate_labels({"example.com/zone": "lab-1", "tier": "", "gpus": 2, "fast": True}, "l") == {
        "example.com/zone": "lab-1", "tier": "", "gpus": "2", "fast": "true"}


def test_a_node_selector_confines_the_job_to_edge_devices() -> None:
    doc = job_doc("sel")
    doc["spec"]["placement"] = {"nodeSelector": {"zone": "lab"}}
    spec = parse_job_spec(doc)
    assert spec.request.node_selector == (("zone", "lab"),) and spec.request.providers == ("edge",)
    doc["spec"]["placement"] = {"providers": ["aws"], "nodeSelector": {"zone": "lab"}}
    with pytest.raises(SpecError, match="leaves out edge"):
        parse_job_spec(doc)
    doc["spec"]["placement"] = {"nodeSelector": {"zone": "la b"}}
    with pytest.raises(SpecError, match=r"spec\.placement\.nodeSelector\.zone"):
        parse_job_spec(doc)


def _enroll(st: Stack, state_dir: Path, device_id: str, *, token_labels: dict[str, str],
            own_labels: dict[str, str]) -> AgentProcess:
    from edge.agent.enroll import enroll

    r = httpx.post(f"{st.url}/v1/edge/enroll-tokens", json={"namespace": NS, "labels": token_labels},
                   headers=ADMIN_H)
    assert r.status_code == 201, r.text
    cfg = enroll(st.url, r.json()["token"], state_dir, device_id=device_id, labels=own_labels)
    dataclasses.replace(cfg, heartbeat_seconds=1.0, retransmit_seconds=2.0, reconnect_max_seconds=1,
                        task_user="").save()
    agent = AgentProcess(state_dir)
    agent.start()
    st.agents.append(agent)
    wait_until(lambda: st.device(device_id)["vcpus"] > 0, 20, f"{device_id} to report its capacity")
    return agent


@pytest.mark.slow
def test_a_node_selector_lands_only_on_matching_devices_and_waits_with_a_reason_otherwise(
        tmp_path: Path, stack: Stack, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    _enroll(stack, tmp_path / "lab", "lab-dev", token_labels={"zone": "lab"}, own_labels={"zone": "roof", "cam": "1"})
    _enroll(stack, tmp_path / "field", "field-dev", token_labels={}, own_labels={"zone": "field"})
    assert stack.device("lab-dev")["labels"] == {"zone": "lab", "cam": "1"}  # the token's labels win
    assert stack.device("field-dev")["labels"] == {"zone": "field"}

    code = [sys.executable, "-c", "print('@hb-result 1')"]
    ids = []
    for i in range(3):
        doc = job_doc(f"lab-{i}", command=code)
        doc["spec"]["placement"] = {"nodeSelector": {"zone": "lab"}}
        ids.append(stack.submit(doc))
    for job_id in ids:
        wait_until(lambda j=job_id: _done(stack, j), 30, "the lab job to finish", step=0.2)
        job = stack.get(job_id)
        assert job["state"] == "SUCCEEDED" and job["placement"]["region"] == "lab-dev", job["events"]

    doc = job_doc("roof", command=code)
    doc["spec"]["placement"] = {"nodeSelector": {"zone": "roof", "cam": "1"}}
    roof = stack.submit(doc)
    wait_until(lambda: stack.get(roof).get("held_reason"), 10, "the roof job to be held", step=0.2)
    job = stack.get(roof)
    assert job["state"] == "PENDING"
    assert "no edge device in namespace default matches nodeSelector cam=1, zone=roof" in job["held_reason"]

    # an admin relabels field-dev (CLI through the API): the waiting job lands there
    monkeypatch.setenv("BROKER_URL", stack.url)
    monkeypatch.setenv("BROKER_TOKEN", ADMIN)
    _cli("devices", "label", "field-dev", "zone=roof", "cam=1")
    assert stack.device("field-dev")["labels"] == {"zone": "roof", "cam": "1"}
    capsys.readouterr()
    _cli("devices", "list")
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("field-dev ")]
    assert row.endswith(" cam=1,zone=roof")
    wait_until(lambda: _done(stack, roof), 30, "the roof job to finish", step=0.2)
    job = stack.get(roof)
    assert job["state"] == "SUCCEEDED" and job["placement"]["region"] == "field-dev", job["events"]

    # removal (key-) and bad input: 400 with what is wrong, 404 for an unknown device; nothing changes
    _cli("devices", "label", "field-dev", "cam-")
    assert stack.device("field-dev")["labels"] == {"zone": "roof"}
    r = httpx.patch(f"{stack.url}/v1/devices/field-dev", json={"labels": {"zone": "not ok"}}, headers=ADMIN_H)
    assert r.status_code == 400 and "invalid label value" in r.json()["detail"]
    r = httpx.patch(f"{stack.url}/v1/devices/nope-dev", json={"labels": {"zone": "x"}}, headers=ADMIN_H)
    assert r.status_code == 404
    r = httpx.post(f"{stack.url}/v1/edge/enroll-tokens", json={"namespace": NS, "labels": {"bad key": "x"}},
                   headers=ADMIN_H)
    assert r.status_code == 400 and "invalid label key" in r.json()["detail"]
    assert stack.device("field-dev")["labels"] == {"zone": "roof"}
