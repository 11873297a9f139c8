"""Probes and heartbeats of edge runs (issue 14 item 1, edge part): the agent runs the task's liveness and
readiness probes (exec, httpGet, tcpSocket) next to it, reports the results over the signed uplink into
``probe_states``, restarts the task when its liveness probe fails (restartPolicy OnFailure) or fails it
(Never); a device whose heartbeats stop is lost and its job re-placed once. Real parts throughout: the
broker under uvicorn, Mosquitto with mTLS from the generated config, agents as processes."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from broker.errors import SpecError
from broker.ops.store import ProbeStateRow
from edge import protocol
from tests.edge.conftest import free_port, wait_until
from tests.edge.test_edge_gateway import Dev, rig, spec  # noqa: F401 - rig is a fixture
from tests.edge.test_edge_service import Stack, _done, job_doc, open_stack


def test_the_task_carries_the_specs_probes_and_restart_policy() -> None:
    from datetime import UTC, datetime

    from broker.gateway import task_body
    from broker.spec import parse_job_spec

    doc = job_doc("p", providers=["edge"])
    doc["spec"]["livenessProbe"] = {"tcpSocket": {"port": 9}}
    doc["spec"]["restartPolicy"] = "Never"
    body = task_body("t.1", "j-r0", parse_job_spec(doc), datetime(2030, 1, 1, tzinfo=UTC))
    assert body["probes"] == {"livenessProbe": {"tcpSocket": {"port": 9}}} and body["restart_policy"] == "Never"
    assert "probes" not in task_body("t.2", "j-r0", parse_job_spec(job_doc("q")), datetime(2030, 1, 1, tzinfo=UTC))
    doc["spec"]["restartPolicy"] = "Always"
    with pytest.raises(SpecError, match=r"spec\.restartPolicy: 'Always': use OnFailure or Never"):
        parse_job_spec(doc)


def test_probe_reports_of_a_running_task_reach_the_sink_and_malformed_ones_are_counted(rig: Any) -> None:  # noqa: F811
    gw, clock, store, ca = rig
    dev = Dev(store, ca, clock, "probe-unit")
    gw.process([dev.msg("hello", {})])
    gw.dispatch("probe-unit", "job-p-r0", spec(), clock.now() + timedelta(hours=1))
    gw.process([dev.msg("status", {"task_id": "job-p-r0.1", "state": "running"})])
    good = {"task_id": "job-p-r0.1", "state": "probe", "probe": "liveness", "ok": False, "failures": 2,
            "successes": 0, "ready": False, "message": "exit code 1", "restarts": 0}
    bad = {**good, "failures": "two"}
    restarted = {"task_id": "job-p-r0.1", "state": "restarted", "probe": "liveness", "ok": False, "restarts": 1,
                 "message": "liveness probe failed 2 times (exit code 1); restarting in 10 s"}
    assert gw.process([dev.msg("status", good), dev.msg("status", bad), dev.msg("status", restarted)]) == 3
    probes = [c for c in gw.sink.calls if c[1] == "PROBE"]  # type: ignore[attr-defined]
    assert [(c[0], c[3]["probe"], c[3]["failures"], c[3]["restarted"]) for c in probes] == [
        ("job-p-r0", "liveness", 2, False), ("job-p-r0", "liveness", 0, True)]
    assert gw.rejections.counts.get(protocol.MALFORMED) == 1


# First start: serve HTTP on PORT, be healthy (a file), report a result, then turn unhealthy and hang.
# After the agent restarts it: serve again, report, and exit 0.
FLAKY = """
import http.server, os, sys, threading, time
port = int(sys.argv[1])
runs = int(open('runs').read()) + 1 if os.path.exists('runs') else 1
open('runs', 'w').write(str(runs))
srv = http.server.HTTPServer(('127.0.0.1', port), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=srv.serve_forever, daemon=True).start()
open('healthy', 'w').close()
print('@hb-result %d' % runs, flush=True)
time.sleep(2.5)
if runs == 1:
    os.remove('healthy')
    time.sleep(120)
"""


def _probe_rows(st: Stack, job_id: str) -> dict[str, Any]:
    t = ProbeStateRow.__table__  # type: ignore[attr-defined]
    with st.app.state.hb.store.read() as s:
        return {r.probe: r for r in s.execute(sa.select(t).where(t.c.job_id == job_id))}


@pytest.mark.network
@pytest.mark.slow
def test_a_failing_liveness_probe_restarts_the_task_on_the_device_and_results_reach_probe_states(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_stack(tmp_path, monkeypatch) as st:
        st.enroll(tmp_path / "dev", "probe-dev", restart_backoff_seconds=0.5)
        port = free_port()
        doc = job_doc("flaky", providers=["edge"], command=[sys.executable, "-c", FLAKY, str(port)])
        doc["spec"]["livenessProbe"] = {"exec": {"command": ["test", "-f", "healthy"]}, "initialDelaySeconds": 1,
                                        "periodSeconds": 1, "failureThreshold": 2}
        doc["spec"]["readinessProbe"] = {"httpGet": {"port": port, "path": "/"}, "periodSeconds": 1}
        job_id = st.submit(doc)
        wait_until(lambda: _probe_rows(st, job_id).get("readiness") is not None
                   and _probe_rows(st, job_id)["readiness"].ready, 30, "the readiness probe to pass", step=0.2)
        wait_until(lambda: _done(st, job_id), 40, "the job to finish", step=0.2)
        job = st.get(job_id)
        assert job["state"] == "SUCCEEDED" and job["exit_code"] == 0, job["events"]
        restarts = [e for e in job["events"] if "restarted task" in e["reason"]]
        assert len(restarts) == 1, job["events"]
        assert "liveness probe failed 2 times (exit code 1)" in restarts[0]["reason"]
        assert restarts[0]["data"]["device"] == "probe-dev" and restarts[0]["data"]["restarts"] == 1
        final = job["events"][-1]["data"]
        # a restart re-runs the command, whose result ids start again at r0 (as after a reboot): what the first
        # run reported is kept once, never twice
        assert final["results"] == [1]
        (runs,) = (tmp_path / "dev-tasks").glob("*/runs")  # the command ran twice, in the same directory
        assert runs.read_text() == "2"
        assert [e["to"] for e in job["events"] if e["from"] != e["to"]].count("SUCCEEDED") == 1


@pytest.mark.network
@pytest.mark.slow
def test_with_restart_policy_never_a_failing_liveness_probe_fails_the_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_stack(tmp_path, monkeypatch) as st:
        st.enroll(tmp_path / "dev", "never-dev")
        doc = job_doc("never", providers=["edge"], command=[sys.executable, "-c", "import time; time.sleep(60)"],
                      backoff_limit=0)
        doc["spec"]["restartPolicy"] = "Never"
        doc["spec"]["livenessProbe"] = {"tcpSocket": {"port": free_port()}, "periodSeconds": 1,
                                        "failureThreshold": 3}
        job_id = st.submit(doc)
        wait_until(lambda: _done(st, job_id), 40, "the job to fail", step=0.2)
        job = st.get(job_id)
        assert job["state"] == "FAILED", job["events"]
        error = job["events"][-1]["data"]["error"]
        assert "liveness probe failed 3 times (tcp 127.0.0.1:" in error and "restartPolicy Never" in error
        row = _probe_rows(st, job_id).get("liveness")
        assert row is not None and row.failures >= 1 and not row.ready
        assert not [e for e in job["events"] if "restarted task" in e["reason"]]


@pytest.mark.network
@pytest.mark.slow
def test_a_device_whose_heartbeats_stop_is_lost_and_its_job_completes_once_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway alone would wait ``replace_after_s`` (300 s here); the health monitor's device timeout
    (``BROKER_DEVICE_LOST_AFTER_SECONDS``) finds the silent device and fences its run."""
    go = tmp_path / "go"
    code = (f"import os, time\nend = time.time() + 30\nwhile not os.path.exists({str(go)!r}) and time.time() < end:"
            "\n    time.sleep(0.05)\nprint('@hb-result 1')\n")
    with open_stack(tmp_path, monkeypatch, gateway_options={"replace_after_s": 300.0, "offline_after_s": 90.0},
                    device_lost_after_seconds=3.0) as st:
        first = st.enroll(tmp_path / "dev-a", "beat-a")
        job_id = st.submit(job_doc("beats", providers=["edge"], command=[sys.executable, "-c", code]))
        wait_until(lambda: any("started task" in e["reason"] for e in st.get(job_id)["events"]), 20,
                   "beat-a to start the task", step=0.1)
        st.enroll(tmp_path / "dev-b", "beat-b")
        first.kill9()  # its heartbeats stop; its task process is left waiting for the go file
        wait_until(lambda: any("device beat-a lost" in e["reason"] for e in st.get(job_id)["events"]), 20,
                   "the health monitor to find beat-a lost", step=0.2)
        go.touch()
        wait_until(lambda: _done(st, job_id), 30, "the job to finish on beat-b", step=0.2)
        job = st.get(job_id)
        assert job["state"] == "SUCCEEDED" and job["placement"]["region"] == "beat-b", job["events"]
        assert [e["to"] for e in job["events"] if e["from"] != e["to"]].count("SUCCEEDED") == 1
        lost = next(e for e in job["events"] if "device beat-a lost" in e["reason"])
        assert lost["data"]["lost"] == "device/beat-a" and lost["data"]["fenced_request_id"]
