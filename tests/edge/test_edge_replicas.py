"""Several broker replicas' gateways on one Mosquitto: the MQTT 5 shared subscription splits the devices'
uplinks between them, and every message still lands exactly once, in order (real Mosquitto with mTLS,
a real agent process)."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from broker import devices
from broker.clock import utcnow
from tests.edge.conftest import AgentProcess, enroll_agent, make_gateway, wait_until
from tests.edge.test_edge_e2e import make_spec, results

pytestmark = [pytest.mark.network, pytest.mark.slow]

N = 40
PRODUCER = f"import sys\nw = sys.stdout.write\nfor i in range({N}): w('@hb-result %d\\n' % i)\n"


def test_three_gateways_in_one_group_split_the_uplinks_and_lose_or_repeat_none(
        tmp_path: Path, store: Any, mosquitto: Any, edge_api: Any, fresh_ca: Any) -> None:
    gateways = [make_gateway(store, mosquitto, fresh_ca, client_id=f"hb-gateway-replica-{i}") for i in range(3)]
    agent = AgentProcess(tmp_path / "dev")
    try:
        enroll_agent(tmp_path / "dev", edge_api, store, mosquitto, "edge-rep-1")
        agent.start()
        gateways[0].dispatch("edge-rep-1", "job-rep", make_spec([sys.executable, "-c", PRODUCER]),
                             utcnow() + timedelta(minutes=5))

        def task_state() -> str | None:
            with store.read() as s:
                task = s.get(devices.EdgeTaskRow, "job-rep.1")
                return task.state if task is not None else None

        wait_until(lambda: task_state() == "succeeded", 60, "the task to succeed")
        wait_until(lambda: len(results(store, "edge-rep-1", "job-rep.1")) >= N, 30, "every result")
        got = [r["value"] for r in results(store, "edge-rep-1", "job-rep.1")]
        assert got == list(range(N))  # exactly once, in the order produced
        accepted = [gw.accepted for gw in gateways]
        # the shared subscription gave uplinks to more than one replica
        assert sum(1 for a in accepted if a > 0) >= 2, accepted
        assert sum(accepted) >= N, accepted
    finally:
        agent.stop()
        for gw in gateways:
            gw.stop()
