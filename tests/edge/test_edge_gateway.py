"""Gateway logic with an injected clock (no MQTT needed: ``process`` and ``check_devices`` are called
directly): registry updates, idempotent storage, dispatch, lost tasks re-placed once, late outcomes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from broker import devices
from broker.clock import ManualClock
from broker.errors import NotFoundError
from broker.gateway import Gateway, RecordingSink
from broker.model import JobSpec, Request
from edge import pki, protocol
from tests.edge.conftest import new_token


class Dev:
    def __init__(self, store: Any, ca: Any, clock: ManualClock, device_id: str) -> None:
        self.id, self.clock, self.seq = device_id, clock, 0
        self.key = pki.generate_key()
        with store.tx() as s:
            devices.enroll_device(s, ca, new_token(store), pki.make_csr(self.key, device_id).decode(),
                                  now=clock.now())

    def msg(self, kind: str, body: dict[str, Any], **kw: Any) -> tuple[str, bytes]:
        seq = kw.pop("seq", self.seq)
        self.seq = seq + 1
        ts = int(self.clock.now().timestamp() * 1000)
        return protocol.up_topic(self.id, kind), protocol.seal(kind, body, device=self.id, seq=seq, key=self.key,
                                                               ts=ts, **kw)


@pytest.fixture()
def rig(store: Any, fresh_ca: Any) -> Any:
    clock = ManualClock()
    d = fresh_ca.directory
    gw = Gateway(store, host="127.0.0.1", port=1, ca_file=str(d / "ca.pem"), cert_file=str(d / "gateway.pem"),
                 key_file=str(d / "gateway.key"), sink=RecordingSink(), clock=clock, replace_after_s=300)
    return gw, clock, store, fresh_ca


def spec() -> JobSpec:
    return JobSpec(name="j", request=Request(name="j", vcpus=1, memory_gib=1), command=("true",))


def test_capacity_and_hello_fill_the_registry_and_uplinks_are_stored_once(rig: Any) -> None:
    gw, clock, store, ca = rig
    dev = Dev(store, ca, clock, "reg-dev")
    hello = dev.msg("hello", {"agent_version": "0.1.0"})
    cap = dev.msg("capacity", {"vcpus": 4, "memory_gib": 7.5, "gpus": 1, "arch": "arm64", "disk_gib": 20,
                               "agent_version": "0.1.0", "link": {"latency_ms": 8.5, "bandwidth_mbps": 42.0}})
    assert gw.process([hello, cap, cap]) == 2
    assert gw.rejections.counts == {protocol.DUPLICATE: 1}
    with store.read() as s:
        view = devices.device_view(devices.get_device(s, "reg-dev"), clock.now())
    assert {k: view[k] for k in ("status", "vcpus", "gpus", "arch", "bandwidth_mbps", "latency_ms",
                                 "agent_version")} == {"status": "online", "vcpus": 4, "gpus": 1, "arch": "arm64",
                                                       "bandwidth_mbps": 42.0, "latency_ms": 8.5,
                                                       "agent_version": "0.1.0"}
    gw.process([dev.msg("telemetry", {}, seq=5)])  # a gap: refused until the missing ones come
    assert gw.rejections.counts[protocol.GAP] == 1
    clock.advance(devices.OFFLINE_AFTER_SECONDS + 1)
    gw.check_devices()
    with store.read() as s:
        assert devices.device_view(devices.get_device(s, "reg-dev"), clock.now())["status"] == "offline"


def test_a_task_on_a_device_gone_offline_is_lost_once_and_a_late_result_is_not_reported(rig: Any) -> None:
    gw, clock, store, ca = rig
    dev = Dev(store, ca, clock, "lost-dev")
    gw.process([dev.msg("hello", {})])
    gw.dispatch("lost-dev", "job-9", spec(), clock.now() + timedelta(hours=1))
    gw.process([dev.msg("status", {"task_id": "job-9.1", "state": "running"})])
    clock.advance(200)
    gw.check_devices()
    assert [c[1] for c in gw.sink.calls] == ["RUNNING"]  # not yet: offline for less than replace_after_s
    clock.advance(200)
    gw.check_devices()
    gw.check_devices()
    assert [c[1] for c in gw.sink.calls] == ["RUNNING", "LOST"]
    assert gw.sink.calls[-1][3]["reason"] == "device offline"
    # the scheduler re-places: a second dispatch of the same job gets a new task id
    other = Dev(store, ca, clock, "other-dev")
    gw.process([other.msg("hello", {})])
    gw.dispatch("other-dev", "job-9", spec(), clock.now() + timedelta(hours=1))
    gw.process([other.msg("result", {"task_id": "job-9.2", "state": "succeeded", "exit_code": 0, "final": True})])
    # the first device comes back and reports it finished too: recorded, never reported
    gw.process([dev.msg("result", {"task_id": "job-9.1", "state": "succeeded", "exit_code": 0, "final": True})])
    assert [c[1] for c in gw.sink.calls] == ["RUNNING", "LOST", "SUCCEEDED"]
    with store.read() as s:
        first = s.get(devices.EdgeTaskRow, "job-9.1")
        assert first is not None and (first.state, first.late_outcome) == ("lost", "succeeded")


def test_an_undelivered_task_expires_and_unknown_devices_cannot_be_dispatched_to(rig: Any) -> None:
    gw, clock, store, ca = rig
    dev = Dev(store, ca, clock, "exp-dev")
    gw.process([dev.msg("hello", {})])
    gw.dispatch("exp-dev", "job-e", spec(), clock.now() + timedelta(seconds=30))
    clock.advance(31)
    gw.check_devices()
    assert gw.sink.calls[-1][1:2] == ("LOST",) and gw.sink.calls[-1][3]["reason"] == "expired"
    with pytest.raises(NotFoundError, match="To fix"):
        gw.dispatch("ghost-dev", "job-x", spec(), clock.now() + timedelta(minutes=1))
    with store.tx() as s:
        devices.revoke_device(s, None, "exp-dev", now=clock.now())
    with pytest.raises(NotFoundError):
        gw.dispatch("exp-dev", "job-y", spec(), clock.now() + timedelta(minutes=1))
    before = gw.rejections.counts.get(protocol.REVOKED, 0)
    gw.process([dev.msg("telemetry", {})])
    assert gw.rejections.counts[protocol.REVOKED] == before + 1
