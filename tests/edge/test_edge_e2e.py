"""End to end through a real Mosquitto with mutual TLS: enroll -> connect -> task -> run -> result stored,
and the durable outbox across offline periods, Mosquitto restarts and a SIGKILLed agent."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from broker import devices
from broker.clock import utcnow
from broker.model import JobSpec, Request
from tests.edge.conftest import AgentProcess, enroll_agent, make_gateway, wait_until

pytestmark = pytest.mark.network


def make_spec(command: list[str], *, memory_gib: float = 0.5, hours: float = 0.1) -> JobSpec:
    return JobSpec(name="t", request=Request(name="t", vcpus=1, memory_gib=memory_gib, duration_hours=hours),
                   command=tuple(command))


def results(store: Any, device_id: str, task_id: str) -> list[dict[str, Any]]:
    with store.read() as s:
        return [b for _seq, b in devices.uplink_bodies(s, device_id, "result")
                if b.get("task_id") == task_id and not b.get("final")]


def final_of(store: Any, device_id: str, task_id: str) -> dict[str, Any] | None:
    with store.read() as s:
        for _seq, b in devices.uplink_bodies(s, device_id, "result"):
            if b.get("task_id") == task_id and b.get("final"):
                return b
    return None


def device(store: Any, device_id: str) -> devices.EdgeDeviceRow:
    with store.read() as s:
        return devices.get_device(s, device_id)


def test_enroll_connect_task_run_and_result_are_stored(tmp_path: Path, store: Any, mosquitto: Any,
                                                       edge_api: Any, fresh_ca: Any) -> None:
    gw = make_gateway(store, mosquitto, fresh_ca)
    agent = AgentProcess(tmp_path / "dev")
    try:
        enroll_agent(tmp_path / "dev", edge_api, store, mosquitto, "edge-e2e-1")
        assert (tmp_path / "dev" / "device.key").stat().st_mode & 0o777 == 0o600
        agent.start()
        # capacity and the measured link come in separate reports: wait for both (under load they can lag)
        wait_until(lambda: device(store, "edge-e2e-1").vcpus > 0, 20, "the device to report its capacity")
        wait_until(lambda: (device(store, "edge-e2e-1").bandwidth_mbps or 0) > 0, 20,
                   "the device to report the link bandwidth it measured")
        dev = device(store, "edge-e2e-1")
        assert dev.online and dev.agent_version and dev.arch in ("amd64", "arm64")
        assert dev.bandwidth_mbps is not None and dev.bandwidth_mbps > 0  # measured against /v1/edge/probe
        code = "import json\nfor i in range(3): print('@hb-result ' + json.dumps({'i': i, 'sq': i * i}))\n"
        gw.dispatch("edge-e2e-1", "job-1", make_spec([sys.executable, "-c", code]),
                    utcnow() + timedelta(minutes=5))
        assert gw.sink.wait_for("job-1", "SUCCEEDED", 30), gw.sink.calls
        assert [r["value"] for r in results(store, "edge-e2e-1", "job-1.1")] == [
            {"i": 0, "sq": 0}, {"i": 1, "sq": 1}, {"i": 2, "sq": 4}]
        states = [c[1] for c in gw.sink.calls if c[0] == "job-1"]
        assert states == ["RUNNING", "SUCCEEDED"]
        with store.read() as s:
            task = s.get(devices.EdgeTaskRow, "job-1.1")
            assert task is not None and task.state == "succeeded" and task.exit_code == 0
        # the same task id sent again is refused by the agent, and nothing is reported twice
        gw.send("edge-e2e-1", "task", json.loads(task.body), id="job-1.1-again")
        wait_until(lambda: any(b.get("state") == "duplicate" for _s, b in _statuses(store, "edge-e2e-1")), 20,
                   "the agent to refuse the duplicate task")
        assert [c[1] for c in gw.sink.calls if c[0] == "job-1"] == ["RUNNING", "SUCCEEDED"]
        assert len(results(store, "edge-e2e-1", "job-1.1")) == 3
    finally:
        agent.stop()
        gw.stop()


def _statuses(store: Any, device_id: str) -> list[tuple[int, dict[str, Any]]]:
    with store.read() as s:
        return devices.uplink_bodies(s, device_id, "status")


N = 10_000
PRODUCER = (
    "import os, sys, time\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
    f"w = sys.stdout.write\nfor i in range({N}): w('@hb-result %d\\n' % i)\n"
)


def _outbox_results(state_dir: Path) -> int:
    from edge.agent.store import Store

    st = Store(state_dir / "agent.db")
    try:
        return st.depth()["results"]
    finally:
        st.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "disturbance",
    ["none", "mosquitto restarted mid-stream", "agent SIGKILLed and restarted while offline"],
    ids=["10k results made offline all arrive once in order",
         "10k results arrive once in order across a Mosquitto restart mid-stream",
         "10k results arrive once in order after the agent is SIGKILLed offline"],
)
def test_offline_backlog_arrives_exactly_once_in_order(disturbance: str, tmp_path: Path, store: Any,
                                                       mosquitto: Any, edge_api: Any, fresh_ca: Any) -> None:
    gw = make_gateway(store, mosquitto, fresh_ca)
    state = tmp_path / "dev"
    agent = AgentProcess(state)
    go = tmp_path / "go"
    try:
        enroll_agent(state, edge_api, store, mosquitto, "edge-bulk-1")
        agent.start()
        gw.dispatch("edge-bulk-1", "job-bulk", make_spec([sys.executable, "-c", PRODUCER, str(go)]),
                    utcnow() + timedelta(minutes=10))
        assert gw.sink.wait_for("job-bulk", "RUNNING", 30)
        mosquitto.stop()  # the device is offline from here
        go.touch()
        wait_until(lambda: _outbox_results(state) >= N + 1, 60, "the offline agent to queue every result")
        if disturbance.startswith("agent"):
            agent.kill9()
            agent.start()
        mosquitto.start()
        if disturbance.startswith("mosquitto"):
            wait_until(lambda: len(results(store, "edge-bulk-1", "job-bulk.1")) >= 1000, 60, "a partial drain")
            mosquitto.restart()
        assert gw.sink.wait_for("job-bulk", "SUCCEEDED", 120), gw.sink.calls
        got = [r["value"] for r in results(store, "edge-bulk-1", "job-bulk.1")]
        # every result exactly once, in the order produced
        assert got == list(range(N)), (gw.rejections.counts, (state / "agent.log").read_text()[-3000:])
        assert final_of(store, "edge-bulk-1", "job-bulk.1") is not None
        wait_until(lambda: _outbox_results(state) == 0, 30, "the outbox to drain after acks")
        assert [c[1] for c in gw.sink.calls if c[0] == "job-bulk"] == ["RUNNING", "SUCCEEDED"]
    finally:
        agent.stop()
        gw.stop()
