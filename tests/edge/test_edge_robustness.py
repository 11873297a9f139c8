"""No device can wedge itself or the fleet (issue #13): sequence windows that survive a re-run, isolated
bad messages, a device ACL that covers shared subscriptions, bounded result lines, and tasks kept away
from the device's identity. Gateway logic runs with an injected clock; the rest against a real
Mosquitto with mutual TLS and agents running as processes."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from broker import devices
from broker.clock import ManualClock, utcnow
from broker.gateway import Gateway, RecordingSink
from edge import protocol
from tests.edge.conftest import MOSQUITTO, make_gateway, wait_until
from tests.edge.test_edge_gateway import Dev, spec
from tests.edge.test_edge_refusals import Fleet


@pytest.fixture()
def rig(store: Any, fresh_ca: Any) -> Any:
    clock = ManualClock()
    d = fresh_ca.directory
    gw = Gateway(store, host="127.0.0.1", port=1, ca_file=str(d / "ca.pem"), cert_file=str(d / "gateway.pem"),
                 key_file=str(d / "gateway.key"), sink=RecordingSink(), clock=clock)
    sent: list[tuple[str, str, dict[str, Any]]] = []
    gw.send = lambda device, kind, body, **_kw: sent.append((device, kind, dict(body)))  # type: ignore[method-assign]
    return gw, clock, store, fresh_ca, sent


def _acked(sent: list[tuple[str, str, dict[str, Any]]], device: str) -> list[str]:
    return [i for d, k, b in sent if d == device and k == "ack" for i in b.get("ids", [])]


def test_a_rerun_tasks_results_under_new_seqs_advance_the_window_and_later_messages_go_through(rig: Any) -> None:
    gw, clock, store, ca, sent = rig
    dev = Dev(store, ca, clock, "rerun-dev")
    gw.process([dev.msg("hello", {})])
    gw.dispatch("rerun-dev", "job-r", spec(), clock.now() + timedelta(hours=1))
    first = [dev.msg("result", {"task_id": "job-r.1", "n": n, "value": n}, id=f"job-r.1/r{n}") for n in range(3)]
    assert gw.process(first) == 3
    # kill -9 mid-task: the re-run re-emits r0..r2 (same ids, new seqs), then the final result
    again = [dev.msg("result", {"task_id": "job-r.1", "n": n, "value": n}, id=f"job-r.1/r{n}") for n in range(3)]
    final = dev.msg("result", {"task_id": "job-r.1", "state": "succeeded", "exit_code": 0, "final": True},
                    id="job-r.1/final")
    assert gw.process([*again, final]) == 1
    assert gw.rejections.counts.get(protocol.GAP, 0) == 0 and gw.duplicates == 3
    assert [c[1] for c in gw.sink.calls] == ["SUCCEEDED"]
    assert _acked(sent, "rerun-dev")[-4:] == ["job-r.1/r0", "job-r.1/r1", "job-r.1/r2", "job-r.1/final"]
    with store.read() as s:
        assert devices.get_device(s, "rerun-dev").last_seq == dev.seq - 1
        assert [b["value"] for _q, b in devices.uplink_bodies(s, "rerun-dev", "result") if not b.get("final")] == [
            0, 1, 2]


def test_a_duplicate_beyond_a_gap_is_not_acknowledged_so_the_device_can_fill_the_gap(rig: Any) -> None:
    gw, clock, store, ca, sent = rig
    dev = Dev(store, ca, clock, "gapdup-dev")
    stored = dev.msg("telemetry", {"x": 1}, id="t-1")
    assert gw.process([stored]) == 1
    lost = dev.msg("telemetry", {"x": 2}, id="t-2")  # lost on the way
    dup_ahead = dev.msg("telemetry", {"x": 1}, id="t-1")  # a re-emitted id, after the loss
    gw.process([dup_ahead])
    assert "t-1" not in _acked(sent, "gapdup-dev")[1:] and sent[-1][2].get("expect") == 1
    assert gw.process([lost]) == 1
    gw.process([dup_ahead])
    assert _acked(sent, "gapdup-dev")[-1] == "t-1"
    with store.read() as s:
        assert devices.get_device(s, "gapdup-dev").last_seq == 2


def test_a_device_returning_after_its_task_was_given_up_is_told_to_cancel_it_again(rig: Any) -> None:
    gw, clock, store, ca, sent = rig
    dev = Dev(store, ca, clock, "away-dev")
    gw.process([dev.msg("hello", {})])
    gw.dispatch("away-dev", "job-away", spec(), clock.now() + timedelta(hours=1))
    clock.advance(gw.replace_after_s + 1)
    gw.check_devices()
    assert [c[1] for c in gw.sink.calls] == ["LOST"]
    cancels = [b["task_id"] for d, k, b in sent if k == "cancel"]
    assert cancels == ["job-away.1"]  # sent while the device was away: it may never get it
    before = len(sent)
    gw.process([dev.msg("hello", {})])
    assert [b["task_id"] for d, k, b in sent if k == "cancel"] == ["job-away.1", "job-away.1"]
    assert not [b for d, k, b in sent[before:] if k == "task"]  # and the lost task is not re-dispatched


def test_old_uplinks_are_pruned(rig: Any) -> None:
    gw, clock, store, ca, sent = rig
    dev = Dev(store, ca, clock, "prune-dev")
    gw.uplink_retention_s = 3600.0  # (the default is a week; the device certificate lives 72 h)
    gw.process([dev.msg("telemetry", {"x": 1})])
    gw.check_devices()
    with store.read() as s:
        assert len(devices.uplink_bodies(s, "prune-dev")) == 1
    clock.advance(gw.uplink_retention_s + 120)
    gw.process([dev.msg("telemetry", {"x": 2})])
    gw.check_devices()
    with store.read() as s:
        assert [b["x"] for _q, b in devices.uplink_bodies(s, "prune-dev")] == [2]


def test_downlinks_from_several_replicas_are_accepted_out_of_turn_but_never_twice() -> None:
    from edge import pki

    key = pki.generate_key()
    v = protocol.Verifier(ordered=False)
    pub = key.public_key()

    def down(seq: int, id: str) -> protocol.Envelope:
        return protocol.open_envelope(protocol.seal("ack", {"ids": []}, device="d1", seq=seq, key=key, id=id))

    for env in (down(10**15 + 50, "a"), down(10**15, "b")):  # replica B's clock is 50 us behind A's
        v.check(env, device="d1", public_key=pub)
        v.accept(env)
    with pytest.raises(protocol.Rejected) as rej:
        v.check(down(10**15 + 99, "a"), device="d1", public_key=pub)
    assert rej.value.reason == protocol.DUPLICATE
    ordered = protocol.Verifier()  # uplinks stay ordered: a lower seq there is a replay
    ordered.accept(down(5, "x"))
    with pytest.raises(protocol.Rejected, match="replay"):
        ordered.check(down(4, "y"), device="d1", public_key=pub)


def test_a_gateway_that_fell_behind_judges_staleness_by_when_a_message_arrived(rig: Any) -> None:
    gw, clock, store, ca, sent = rig
    dev = Dev(store, ca, clock, "late-dev")
    topic, payload = dev.msg("telemetry", {"x": 1})
    arrived_ms = int(clock.now().timestamp() * 1000)
    clock.advance(gw.window_ms / 1000 + 60)  # processed long after it arrived (a backlog in the inbox)
    assert gw.process([(topic, payload, arrived_ms)]) == 1
    old = protocol.seal("telemetry", {"x": 2}, device=dev.id, seq=dev.seq, key=dev.key, ts=arrived_ms)
    assert gw.process([(topic, old)]) == 0  # but one that is old when it arrives is stale
    assert gw.rejections.counts == {protocol.STALE: 1}


def _deep(n: int) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for _ in range(n):
        body = {"a": body}
    return body


@pytest.mark.parametrize("bad", [
    ("capacity", {"vcpus": "lots", "memory_gib": 1}),
    ("capacity", {"vcpus": 2, "link": "fast"}),
    ("status", {"task_id": ["x"], "state": "running"}),
    ("result", {"task_id": "job-m.1", "state": "succeeded", "exit_code": "0", "final": True}),
    ("telemetry", _deep(200)),
], ids=["string vcpus", "string link", "list task id", "string exit code", "200-deep nesting"])
def test_a_malformed_signed_message_is_rejected_alone_and_the_other_devices_batch_goes_through(
        rig: Any, bad: tuple[str, dict[str, Any]]) -> None:
    gw, clock, store, ca, sent = rig
    good, evil = Dev(store, ca, clock, "good-dev"), Dev(store, ca, clock, "evil-dev")
    gw.process([good.msg("hello", {}), evil.msg("hello", {})])
    gw.dispatch("good-dev", "job-g", spec(), clock.now() + timedelta(hours=1))
    gw.dispatch("evil-dev", "job-m", spec(), clock.now() + timedelta(hours=1))
    batch = [evil.msg(*bad), good.msg("result", {"task_id": "job-g.1", "state": "succeeded", "exit_code": 0,
                                                 "final": True}), evil.msg("heartbeat", {})]
    gw.process_isolated(batch)
    assert [c[:2] for c in gw.sink.calls] == [("job-g", "SUCCEEDED")]
    assert gw.rejections.counts.get(protocol.MALFORMED) == 1
    with store.read() as s:
        evil_row = devices.get_device(s, "evil-dev")
        assert evil_row.vcpus == 0 and s.get(devices.EdgeTaskRow, "job-m.1").state == "dispatched"
        if bad[0] != "telemetry":  # in sequence: the window moves past it, the device is not wedged
            assert evil_row.last_seq == evil.seq - 1


def test_a_message_that_breaks_processing_costs_only_its_sender(rig: Any) -> None:
    gw, clock, store, ca, sent = rig
    good, evil = Dev(store, ca, clock, "good2-dev"), Dev(store, ca, clock, "evil2-dev")
    real_apply = gw._apply

    def apply(s: Any, dev: Any, env: Any, *a: Any) -> None:
        if dev.id == "evil2-dev":
            raise RuntimeError("a bug this message hits")
        real_apply(s, dev, env, *a)

    gw._apply = apply  # type: ignore[method-assign]
    assert gw.process_isolated([evil.msg("hello", {}), good.msg("hello", {}), good.msg("heartbeat", {})]) == 2
    assert gw.rejections.counts == {protocol.MALFORMED: 1}
    assert _acked(sent, "good2-dev") and not _acked(sent, "evil2-dev")


# ---- the ACL and the gateway's shared subscription (real Mosquitto, mutual TLS) ----------------------------
@pytest.fixture()
def own_fleet(tmp_path: Path) -> Iterator[tuple[Fleet, Any]]:
    """A fleet of its own (Mosquitto from the generated config, a store, a connected gateway)."""
    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install -y mosquitto)")
    fleet = Fleet(tmp_path)
    fleet.mosq.start()
    gw = fleet.gw = make_gateway(fleet.store, fleet.mosq, fleet.ca)
    try:
        yield fleet, gw
    finally:
        gw.stop()
        fleet.mosq.stop()
        fleet.store.dispose()


def _raw_client(fleet: Fleet, device_id: str, cert: Path, key: Path) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device_id, protocol=MQTTProtocolVersion.MQTTv5)
    c.tls_set(ca_certs=str(fleet.ca.directory / "ca.pem"), certfile=str(cert), keyfile=str(key),
              tls_version=ssl.PROTOCOL_TLS_CLIENT)
    return c


class _Subscriber:
    """A raw device connection that records SUBACK reason codes per filter and what it receives."""

    def __init__(self, fleet: Fleet, device_id: str, cert: Path, key: Path) -> None:
        self.got: list[str] = []
        self.subacks: dict[int, list[Any]] = {}
        self.disconnected = threading.Event()
        self.c = _raw_client(fleet, device_id, cert, key)
        self.c.on_message = lambda _c, _u, m: self.got.append(m.topic)
        self.c.on_subscribe = lambda _c, _u, mid, rcs, _p: self.subacks.__setitem__(mid, list(rcs))
        self.c.on_disconnect = lambda *_a: self.disconnected.set()
        self.c.reconnect_delay_set(30, 60)
        self.c.connect("127.0.0.1", fleet.mosq.port)
        self.c.loop_start()

    def suback(self, topic: str) -> Any:
        mid = self.c.subscribe(topic, qos=1)[1]
        wait_until(lambda: mid in self.subacks, 5, f"the SUBACK for {topic}")
        (rc,) = self.subacks[mid]
        return rc

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@pytest.mark.network
def test_a_devices_foreign_and_shared_subscriptions_are_refused_at_suback(own_fleet: Any) -> None:
    """Mosquitto's dynamic-security plugin (from ``broker mqtt config``, filled by the gateway) refuses a
    device's SUBSCRIBE outside its own downlink subtree, ``$share/<the gateway's group>/...`` included."""
    fleet, gw = own_fleet
    victim = fleet.device("victim-dev")
    nosy = _Subscriber(fleet, "nosy-dev", *fleet.enroll("nosy-dev"))
    try:
        assert victim.connect()
        assert gw.acl_managed is True  # the gateway found the plugin and reconciled it in full on connect
        refused = [f"$share/{gw.group}/hb/v1/dev/+/up/#", "$share/hb-gateway/hb/v1/dev/+/up/#",
                   "$share/x/hb/v1/dev/nosy-dev/down/#", "hb/v1/dev/+/up/#", "hb/v1/dev/victim-dev/#",
                   "hb/v1/dev/victim-dev/down/#", "#", "$CONTROL/dynamic-security/v1/response"]
        for f in refused:
            rc = nosy.suback(f)
            assert rc.is_failure and rc.value == 0x87, (f, rc)  # MQTT 5 "Not authorized"
        own = nosy.suback("hb/v1/dev/nosy-dev/down/#")
        assert not own.is_failure and own.value == 1
        assert victim.publish(victim.seal({"i": 0}), topic_device="nosy-dev").is_failure  # not its topic
        victim.seq = 0  # that one never reached the gateway
        for i in range(20):
            assert not victim.publish(victim.seal({"i": i})).is_failure
        wait_until(lambda: fleet.stored("victim-dev") == 20, 15, "every victim message to reach the gateway")
        assert gw.rejections.counts.get(protocol.GAP, 0) == 0  # nothing was taken out of the gateway's group
        gw.send("victim-dev", "ack", {"ids": []})
        gw.send("nosy-dev", "ack", {"ids": []})
        wait_until(lambda: nosy.got == ["hb/v1/dev/nosy-dev/down/ack"], 5, "its own downlink, and only that")

        # revocation: the plugin's client is deleted (which disconnects it) and every SUBSCRIBE is refused
        with fleet.store.tx() as s:
            devices.revoke_device(s, fleet.ca, "nosy-dev", now=utcnow())
        assert nosy.disconnected.wait(5)  # the gateway's sync thread deleted its client (within acl_sync_s)
        (listed,) = gw.control([{"command": "listClients"}]) or [{}]
        assert "victim-dev" in listed["data"]["clients"] and "nosy-dev" not in listed["data"]["clients"]
        again = _Subscriber(fleet, "nosy-dev", fleet.root / "nosy-dev.pem", fleet.root / "nosy-dev.key")
        try:  # the CRL is not reloaded here: the plugin alone shuts it out
            assert again.suback("hb/v1/dev/nosy-dev/down/#").is_failure
        finally:
            again.close()
        assert not victim.publish(victim.seal({"i": 20})).is_failure
        wait_until(lambda: fleet.stored("victim-dev") == 21, 10, "the gateway to go on receiving")
    finally:
        nosy.close()
        victim.close()


@pytest.mark.network
def test_an_agent_refused_at_suback_retries_until_the_gateway_lets_it_in(tmp_path: Path) -> None:
    """Right after enrollment the plugin may not know the device yet: its SUBSCRIBE is refused, the agent's
    transport does not count as connected (nothing is published) and retries until it is granted."""
    from edge.agent.transport import MqttTransport

    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install -y mosquitto)")
    fleet = Fleet(tmp_path)
    fleet.mosq.start()
    gw = make_gateway(fleet.store, fleet.mosq, fleet.ca, acl_sync_s=3600, acl_full_sync_s=3600)
    states: list[bool] = []
    t = None
    try:
        # the connect-time sync runs on the gateway's own thread: once it is done, a device enrolled now stays
        # unknown to the plugin until the next sync (an hour here)
        wait_until(lambda: gw.acl_managed is True, 10, "the gateway's connect-time ACL sync")
        cert, key = fleet.enroll("late-dev")
        t = MqttTransport(client_id="late-dev", host="127.0.0.1", port=fleet.mosq.port,
                          ca_file=str(fleet.ca.directory / "ca.pem"), cert_file=str(cert), key_file=str(key),
                          subscribe=protocol.down_topic("late-dev", "#"), on_message=lambda *_a: None,
                          on_state=states.append, reconnect_max_seconds=1)
        wait_until(lambda: t.subscribe_refusals >= 2, 10, "the SUBSCRIBE to be refused and retried")
        assert not t.connected and states == []
        assert gw.sync_acl() == (1, 0)
        wait_until(lambda: t.connected, 10, "the retried SUBSCRIBE to be granted")
        assert states == [True]
    finally:
        if t is not None:
            t.close()
        gw.stop()
        fleet.mosq.stop()
        fleet.store.dispose()


def test_a_retried_subscribes_suback_handled_before_subscribe_returns_still_counts(tmp_path: Path) -> None:
    """A refused SUBSCRIBE is retried from a timer thread; its SUBACK can be handled by paho's network thread
    before ``subscribe()`` has returned the mid (seen under load: the grant was ignored, the device never came
    in). The grant must still be matched to the retry."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    from edge.agent.transport import MqttTransport

    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install -y mosquitto)")
    fleet = Fleet(tmp_path)
    cert, key = fleet.enroll("racy-dev")
    states: list[bool] = []
    # nothing listens on the port: the real client keeps trying to connect while the retry is exercised below
    t = MqttTransport(client_id="racy-dev", host="127.0.0.1", port=fleet.mosq.port,
                      ca_file=str(fleet.ca.directory / "ca.pem"), cert_file=str(cert), key_file=str(key),
                      subscribe=protocol.down_topic("racy-dev", "#"), on_message=lambda *_a: None,
                      on_state=states.append, reconnect_max_seconds=1)

    class SubackFirst:
        """A client whose SUBACK is handled on another thread before ``subscribe()`` returns."""

        def subscribe(self, _topic: str, qos: int) -> tuple[int, int]:
            granted = [ReasonCode(PacketTypes.SUBACK, identifier=qos)]
            net = threading.Thread(target=t._handle_subscribe, args=(self, None, 41, granted, None))
            net.start()
            net.join(0.5)
            return 0, 41

    try:
        t._send_subscribe(SubackFirst())
        wait_until(lambda: t.connected, 5, "the granted retry to count")
        assert states == [True]
    finally:
        t.close()
        fleet.store.dispose()


# ---- the executor: bounded result lines, the whole process tree, the task user -----------------------------
def _run_task(root: Path, command: list[str], **extra: Any) -> tuple[str, list[tuple[str, Any, str, bool]]]:
    from edge.agent.executor import TaskHandle, run_task

    emitted: list[tuple[str, Any, str, bool]] = []
    user = extra.pop("user", None)
    body = {"task_id": "t13", "job_id": "j13", "command": command, **extra}
    state, _rc = run_task(body, workdir_root=root, attempt=1, emit=emitted.extend, handle=TaskHandle(), user=user)
    return state, emitted


def test_a_1mib_result_line_fails_the_task_with_a_clear_error_and_every_uplink_fits(tmp_path: Path) -> None:
    from edge.agent.executor import MAX_RESULT_BYTES

    code = ("import sys, time\nprint('@hb-result 1', flush=True)\nsys.stdout.write('@hb-result \"' + 'x' * (1 << 20)"
            " + '\"\\n'); sys.stdout.flush()\nprint('@hb-result 3', flush=True)\ntime.sleep(30)\n")
    state, out = _run_task(tmp_path, [sys.executable, "-c", code], timeout_seconds=60)
    final = out[-1][1]
    assert state == "failed" and final["final"] and "longer than the" in final["error"] and "To fix" in final["error"]
    assert [b["value"] for k, b, i, _d in out if k == "result" and not b.get("final")] == [1]
    assert all(len(protocol.canonical(b)) <= MAX_RESULT_BYTES for _k, b, _i, _d in out)


def test_a_timeout_kills_the_whole_tree_including_a_setsid_child(tmp_path: Path) -> None:
    import psutil

    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
            "print('@hb-result %d' % p.pid, flush=True)\ntime.sleep(300)\n")
    state, out = _run_task(tmp_path, [sys.executable, "-c", code], timeout_seconds=1)
    (child,) = [b["value"] for k, b, _i, _d in out if k == "result" and not b.get("final")]
    assert state == "failed" and "time limit" in out[-1][1]["error"]
    wait_until(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, 5,
               "the setsid child to be killed")


def test_a_stale_saved_pid_is_not_killed_but_the_tasks_own_processes_are() -> None:
    from edge.agent.executor import kill_task, process_tag

    bystander = subprocess.Popen(["sleep", "300"])
    orphan = subprocess.Popen(["sleep", "300"], env={"HB_TASK_RUN": "run-13", "PATH": "/usr/bin:/bin"},
                              start_new_session=True)
    try:
        pid, started, _run = process_tag(bystander.pid, "other-run").split(":")
        stale = f"{pid}:{float(started) - 3600:.3f}:run-13"  # the saved pid, since reused by another program
        assert kill_task(stale) == 1
        assert bystander.poll() is None and orphan.wait(5) == -9
    finally:
        bystander.kill()
        orphan.kill()


def test_a_task_runs_as_the_task_user_with_a_clean_env_and_cannot_read_device_key(
        tmp_path: Path, task_user: str, task_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    key = state_dir / "device.key"
    key.write_text("-----BEGIN PRIVATE KEY-----secret")
    key.chmod(0o600)
    monkeypatch.setenv("HB_AGENT_SECRET", "do-not-leak")
    script = (f"echo \"@hb-result \\\"$(id -un)\\\"\"; echo \"@hb-result \\\"$HB_AGENT_SECRET|$HOME\\\"\"; "
              f"cat {key} && echo '@hb-result \"read\"'; true")
    state, out = _run_task(task_root, ["/bin/sh", "-c", script], user=task_user)
    values = [b["value"] for k, b, _i, _d in out if k == "result" and not b.get("final")]
    assert state == "succeeded", out[-1]
    assert values == [task_user, f"|{task_root / 't13'}"]
    assert "secret" not in json.dumps(out) and "Permission denied" in out[-1][1]["stderr_tail"]
    assert (task_root / "t13").stat().st_uid != 0


def test_a_missing_task_user_fails_the_task_with_what_to_do(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the task user is only switched to by a root agent")
    state, out = _run_task(tmp_path, ["true"], user="no-such-user-13")
    assert state == "failed" and "edge-agent install" in out[-1][1]["error"]


# ---- through real parts: Mosquitto with mTLS, the agent as a process --------------------------------------
RERUN = (
    "import os, sys, time\n"
    "for i in range(3): print('@hb-result %d' % i, flush=True)\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"
    "for i in range(3, 6): print('@hb-result %d' % i, flush=True)\n"
)


@pytest.mark.network
def test_kill_9_mid_task_then_restart_finishes_the_job_with_every_result_once(
        tmp_path: Path, store: Any, mosquitto: Any, edge_api: Any, fresh_ca: Any) -> None:
    from broker.clock import utcnow
    from tests.edge.conftest import AgentProcess, enroll_agent
    from tests.edge.test_edge_e2e import _outbox_results, final_of, make_spec, results

    gw = make_gateway(store, mosquitto, fresh_ca)
    state = tmp_path / "dev"
    agent = AgentProcess(state)
    go = tmp_path / "go"
    try:
        enroll_agent(state, edge_api, store, mosquitto, "rerun-e2e")
        agent.start()
        gw.dispatch("rerun-e2e", "job-k9", make_spec([sys.executable, "-c", RERUN, str(go)]),
                    utcnow() + timedelta(minutes=5))
        wait_until(lambda: len(results(store, "rerun-e2e", "job-k9.1")) == 3, 30, "the first three results")
        wait_until(lambda: _outbox_results(state) == 0, 30, "the agent to get their acknowledgements")
        agent.kill9()  # mid-task: the task's process is orphaned, its results so far are acknowledged
        go.touch()
        agent.start()  # recover: the orphan is killed, the task re-runs and re-emits r0..r2 under new seqs
        assert gw.sink.wait_for("job-k9", "SUCCEEDED", 30), (gw.sink.calls, gw.rejections.counts)
        assert [r["value"] for r in results(store, "rerun-e2e", "job-k9.1")] == [0, 1, 2, 3, 4, 5]
        assert final_of(store, "rerun-e2e", "job-k9.1") is not None
        assert [c[1] for c in gw.sink.calls if c[0] == "job-k9"] == ["RUNNING", "SUCCEEDED"]
        # later messages still go through: the device is not wedged
        gw.dispatch("rerun-e2e", "job-k9b", make_spec(["true"]), utcnow() + timedelta(minutes=5))
        assert gw.sink.wait_for("job-k9b", "SUCCEEDED", 30), gw.rejections.counts
        assert gw.rejections.counts.get(protocol.GAP, 0) < 20  # no re-send storm
    finally:
        agent.stop()
        gw.stop()


@pytest.mark.network
def test_a_task_on_a_real_agent_cannot_read_device_key(tmp_path: Path, store: Any, mosquitto: Any, edge_api: Any,
                                                       fresh_ca: Any, task_user: str, task_root: Path) -> None:
    from broker.clock import utcnow
    from tests.edge.conftest import AgentProcess, enroll_agent
    from tests.edge.test_edge_e2e import final_of, make_spec

    gw = make_gateway(store, mosquitto, fresh_ca)
    state = tmp_path / "dev"
    agent = AgentProcess(state)
    try:
        enroll_agent(state, edge_api, store, mosquitto, "keyed-e2e", task_user=task_user, work_dir=str(task_root))
        agent.start()
        key_text = (state / "device.key").read_text()
        gw.dispatch("keyed-e2e", "job-key", make_spec(["/bin/sh", "-c", f"id -un; cat {state / 'device.key'}"]),
                    utcnow() + timedelta(minutes=5))
        assert gw.sink.wait_for("job-key", "FAILED", 30), gw.sink.calls
        final = final_of(store, "keyed-e2e", "job-key.1")
        assert final is not None and final["stdout_tail"].strip() == task_user
        assert "PRIVATE KEY" not in json.dumps(final) and key_text not in json.dumps(final)
        assert "Permission denied" in final["stderr_tail"]
    finally:
        agent.stop()
        gw.stop()


@pytest.mark.network
def test_revocation_ends_the_devices_open_connection_and_it_cannot_come_back(tmp_path: Path,
                                                                             own_fleet: Any) -> None:
    from broker.clock import utcnow

    fleet, gw = own_fleet
    dev = fleet.device("doomed-dev")
    dropped = threading.Event()
    dev.client.on_disconnect = lambda *_a: dropped.set()
    try:
        assert dev.connect()
        assert not dev.publish(dev.seal({"hi": 1})).is_failure
        wait_until(lambda: fleet.stored("doomed-dev") == 1, 10, "the device to be online")
        with fleet.store.tx() as s:
            devices.revoke_device(s, fleet.ca, "doomed-dev", now=utcnow())
        fleet.mosq.reload_crl()  # the operator's step; Mosquitto checks the CRL only at the handshake
        # the gateway's ACL sync deletes the device's client in the dynamic-security plugin, which ends the
        # connection (within acl_sync_s); check_devices' session takeover does the same without the plugin
        assert dropped.wait(10), "the revoked device's connection stayed open"
        gw.check_devices()
        dev.client.loop_stop()
        again = fleet.device("other-dev")  # the fleet still works
        assert again.connect()
        again.close()
        retry = _raw_client(fleet, "doomed-dev", tmp_path / "doomed-dev.pem", tmp_path / "doomed-dev.key")
        back = threading.Event()
        retry.on_connect = lambda _c, _u, _f, rc, _p: rc.is_failure or back.set()
        try:
            retry.connect("127.0.0.1", fleet.mosq.port)
            retry.loop_start()
            assert not back.wait(3), "the revoked device got back in"
        except (ssl.SSLError, OSError):
            pass  # refused at the handshake (TLS 1.2)
        finally:
            retry.loop_stop()
    finally:
        dev.client.disconnect()


SOAK_TASK = "import time\nfor i in range(40):\n    print('@hb-result %d' % i, flush=True)\n    time.sleep(0.02)\n"


@pytest.mark.network
def test_a_small_soak_with_mosquitto_and_agents_killed_loses_and_duplicates_nothing(
        tmp_path: Path, store: Any, mosquitto: Any, edge_api: Any, fresh_ca: Any) -> None:
    """The bounded version of ``bench/edge.py --soak``: 3 agents, each with 200 queued results and a live
    task, Mosquitto SIGKILLed and restarted and one agent SIGKILLed mid-task and restarted."""
    from broker.clock import utcnow
    from edge.agent.store import Store as AgentStore
    from tests.edge.conftest import AgentProcess, enroll_agent
    from tests.edge.test_edge_e2e import make_spec

    gw = make_gateway(store, mosquitto, fresh_ca)
    ids = [f"soak-{i}" for i in range(3)]
    agents = {d: AgentProcess(tmp_path / d) for d in ids}
    try:
        for i, d in enumerate(ids):
            enroll_agent(tmp_path / d, edge_api, store, mosquitto, d, window=100)
            st = AgentStore(tmp_path / d / "agent.db")
            st.put_many([("result", {"task_id": f"q{i}", "n": n}, f"q{i}/r{n}", False) for n in range(200)])
            st.close()
            agents[d].start()
            gw.dispatch(d, f"job-s{i}", make_spec([sys.executable, "-c", SOAK_TASK]), utcnow() + timedelta(minutes=5))
        assert mosquitto.proc is not None
        wait_until(lambda: gw.accepted > 200, 30, "the drain to start")
        mosquitto.proc.kill()
        mosquitto.proc.wait()
        agents[ids[1]].kill9()
        mosquitto.start()
        agents[ids[1]].start()
        for i in range(3):
            assert gw.sink.wait_for(f"job-s{i}", "SUCCEEDED", 60), (gw.sink.calls, gw.rejections.counts)

        def results_of(d: str, task: str) -> list[int]:
            with store.read() as s:
                return [b["n"] for _q, b in devices.uplink_bodies(s, d, "result")
                        if b.get("task_id") == task and not b.get("final")]

        for i, d in enumerate(ids):
            wait_until(lambda d=d, i=i: len(results_of(d, f"q{i}")) == 200, 60, f"{d}'s queued results")
            assert results_of(d, f"q{i}") == list(range(200))  # once each, in order
            assert results_of(d, f"job-s{i}.1") == list(range(40))
        finals = [c for c in gw.sink.calls if c[1] == "SUCCEEDED"]
        assert sorted(c[0] for c in finals) == ["job-s0", "job-s1", "job-s2"]  # each reported once
    finally:
        for a in agents.values():
            a.stop()
        gw.stop()
