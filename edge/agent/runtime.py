"""The agent's run loop: durable outbox pump, downlink handling, task execution, heartbeats, renewal.

Contracts:

* Uplink messages are written to the SQLite outbox first and published from it, with a contiguous wire
  sequence (0, 1, 2, ...); a message leaves the outbox only when the gateway's ``ack`` names its id.
  After every (re)connect, when the gateway reports a gap (``expect``) and when acks stall for
  ``retransmit_seconds``, the pump starts again at the oldest unacknowledged message (go-back-N), so
  nothing is lost across disconnects, Mosquitto restarts or a SIGKILL of the agent, and the order is the
  outbox order.
* At most ``window`` messages await acknowledgement at once (end-to-end flow control).
* Downlinks are verified (gateway signature, device, time window, duplicate ids) before use; not their
  seq order, since gateway replicas send them (every downlink is idempotent).
* A task id is applied once: a re-dispatch of a finished task is refused and its outcome re-reported.
  Tasks found ``running`` at start (the device rebooted) are restarted at once, offline or not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import ssl
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from edge import pki, protocol
from edge.agent import sysinfo
from edge.agent.config import AGENT_VERSION, AgentConfig
from edge.agent.executor import TaskHandle, kill_task, run_task
from edge.agent.store import Store
from edge.agent.transport import MqttTransport, Transport

__all__ = ["Agent"]

log = logging.getLogger("edge.agent")


class Agent:
    """One enrolled device's agent. ``run()`` blocks until ``stop()``."""

    def __init__(self, config: AgentConfig, *, transport: Transport | None = None) -> None:
        self.config = config
        self.device_id = config.device_id
        self.store = Store(config.path("agent.db"), telemetry_cap=config.telemetry_cap)
        self.key: ec.EllipticCurvePrivateKey = pki.load_key(config.path("device.key"))
        gw = pki.load_cert(config.path("gateway.pem"))
        gw_pub = gw.public_key()
        if not isinstance(gw_pub, ec.EllipticCurvePublicKey):
            raise pki.PkiError("gateway certificate is not EC. To fix: re-enroll the device")
        self.gateway_key = gw_pub
        self.verifier = protocol.Verifier(ordered=False)  # downlinks come from several gateway replicas
        self.rejections = protocol.RejectionCounter()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._unacked: OrderedDict[str, int] = OrderedDict()  # id -> seq, published but not acknowledged
        self._cursor = 0
        self._reset_cursor = True
        self._acks: list[Mapping[str, Any]] = []
        self._last_progress = time.monotonic()
        self._goback_at: float | None = None  # a gap was reported: go back at this time
        self._goback_delay = 0.0  # grows while go-backs bring no progress (never a tight re-send loop)
        self._handles: dict[str, TaskHandle] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._transport = transport
        self._own_transport = transport is None
        self._ssl_ctx: ssl.SSLContext | None = None
        if config.http_ca_file:
            self._ssl_ctx = ssl.create_default_context(cafile=config.http_ca_file)
        self.bandwidth_mbps: float | None = None
        self.published = 0

    # ---- transport ------------------------------------------------------------------------------
    def _make_transport(self) -> Transport:
        c = self.config
        return MqttTransport(
            client_id=self.device_id, host=c.mqtt_host, port=c.mqtt_port, ca_file=str(c.path("ca.pem")),
            cert_file=str(c.path("device.pem")), key_file=str(c.path("device.key")),
            subscribe=protocol.down_topic(self.device_id, "#"), on_message=self.on_downlink,
            on_state=self._on_state, reconnect_max_seconds=c.reconnect_max_seconds,
        )

    def _on_state(self, connected: bool) -> None:
        log.info("mqtt %s", "connected" if connected else "disconnected")
        if connected:
            with self._lock:
                self._reset_cursor = True
            self._hello()
        self._wake.set()

    # ---- uplink ---------------------------------------------------------------------------------
    def emit(self, items: list[tuple[str, Mapping[str, Any], str, bool]]) -> None:
        """Append ``(kind, body, id, droppable)`` messages to the outbox (durable before this returns)."""
        self.store.put_many(items)
        self._wake.set()

    def _hello(self) -> None:
        self.emit([("hello", {"agent_version": AGENT_VERSION, "running": sorted(self._handles)},
                    f"hello-{uuid.uuid4().hex}", True)])
        self._capacity()

    def _capacity(self) -> None:
        lat = getattr(self._transport, "latency_ms", None)
        body = {**sysinfo.capacity(self.config.dir), "agent_version": AGENT_VERSION,
                "link": {"latency_ms": None if lat is None else round(lat, 2),
                         "bandwidth_mbps": self.bandwidth_mbps}}
        self.emit([("capacity", body, f"cap-{uuid.uuid4().hex}", True)])

    def pump(self) -> int:
        """Publish outbox rows after the cursor while the window has room; returns how many were sent."""
        t = self._transport
        if t is None or not t.connected:
            return 0
        with getattr(t, "send_lock", None) or contextlib.nullcontext():
            if not t.connected:
                return 0
            with self._lock:
                stalled = time.monotonic() - self._last_progress > self.config.retransmit_seconds
                if self._unacked and stalled:  # acks stopped coming: go back and re-send (ids dedupe)
                    self._reset_cursor = True
                    self._last_progress = time.monotonic()
                if self._goback_at is not None and time.monotonic() >= self._goback_at:
                    self._reset_cursor, self._goback_at = True, None
                if self._reset_cursor:
                    self._unacked.clear()
                    self._cursor = 0
                    self._reset_cursor = False
                room = self.config.window - len(self._unacked)
                cursor = self._cursor
            if room <= 0:
                return 0
            rows = self.store.assign_wire_seqs(self.store.pending(cursor, min(room, 500)))
            for row in rows:
                assert row.wire_seq is not None
                payload = protocol.seal(row.kind, row.body, device=self.device_id, seq=row.wire_seq,
                                        key=self.key, id=row.id)
                with self._lock:
                    self._unacked[row.id] = row.seq
                    self._cursor = row.seq
                t.publish(protocol.up_topic(self.device_id, row.kind), payload)
        self.published += len(rows)
        return len(rows)

    # ---- downlink -------------------------------------------------------------------------------
    def on_downlink(self, topic: str, payload: bytes) -> None:
        """Verify and apply one downlink message; rejections are counted and logged, never raised."""
        try:
            device, direction, kind = protocol.parse_topic(topic)
            env = protocol.open_envelope(payload)
            if direction != "down" or device != self.device_id or env.kind != kind:
                raise protocol.Rejected(protocol.IDENTITY, f"topic {topic} does not match envelope")
            self.verifier.check(env, device=self.device_id, public_key=self.gateway_key)
        except protocol.Rejected as rej:
            self.rejections.add(rej.reason)
            log.warning("downlink rejected (%s) on %s: %s", rej.reason, topic, rej.detail)
            return
        self.verifier.accept(env)
        if kind == "ack":  # applied in batches by the run loop, off the network thread (acks are idempotent)
            with self._lock:
                self._acks.append(env.body)
            self._wake.set()
            return
        if kind == "task":
            self._on_task(env.body)
        elif kind == "cancel":
            self._on_cancel(str(env.body.get("task_id", "")))
        self._wake.set()

    def _on_cancel(self, task_id: str) -> None:
        """Cancel a task for good: kill it if running, and make sure it never starts afterwards."""
        if not task_id:
            return
        h = self._handles.get(task_id)
        if h is not None:
            h.cancel()
            return
        known = self.store.task(task_id)
        if known is None:
            self.store.add_task(task_id, "", {}, None, state="cancelled")
        elif known.state == "queued":
            self.store.set_task_state(task_id, "cancelled")

    def apply_acks(self) -> int:
        """Delete every acknowledged message received since the last call, in one transaction."""
        with self._lock:
            bodies, self._acks = self._acks, []
        if not bodies:
            return 0
        ids = [str(i) for b in bodies for i in b.get("ids", [])]
        self.store.ack(ids)
        with self._lock:
            now = time.monotonic()
            self._last_progress = now
            for i in ids:
                self._unacked.pop(i, None)
            if ids:
                self._goback_delay = 0.0
            if any("expect" in b for b in bodies) and self._goback_at is None:
                # The gateway saw a gap (messages lost between us, e.g. in an MQTT broker restart): go back
                # to the oldest unacknowledged message, at once the first time, then after a delay doubling
                # up to ``retransmit_seconds`` while go-backs bring no acknowledgement.
                self._goback_at = now + self._goback_delay
                self._goback_delay = min(max(0.25, 2 * self._goback_delay), self.config.retransmit_seconds)
        return len(ids)

    def _on_task(self, body: Mapping[str, Any]) -> None:
        task_id = str(body.get("task_id", ""))
        job_id = str(body.get("job_id", ""))
        if not task_id:
            self.rejections.add(protocol.MALFORMED)
            return
        known = self.store.task(task_id)
        if known is not None:
            if known.state in ("succeeded", "failed", "refused", "cancelled"):
                # Never run a task twice: refuse, and re-report what happened the first time.
                self.emit([("status", {"task_id": task_id, "job_id": job_id, "state": "duplicate",
                                       "outcome": known.state, "exit_code": known.exit_code},
                            f"{task_id}/dup-{uuid.uuid4().hex[:8]}", False)])
            return
        expires = body.get("expires_ms")
        if isinstance(expires, int) and expires < protocol.now_ms():
            self.store.add_task(task_id, job_id, body, expires, state="refused")
            self.emit([("status", {"task_id": task_id, "job_id": job_id, "state": "refused",
                                   "reason": "expired"}, f"{task_id}/refused", False)])
            return
        self.store.add_task(task_id, job_id, body, expires if isinstance(expires, int) else None)

    # ---- tasks ----------------------------------------------------------------------------------
    def _start_ready_tasks(self) -> None:
        limit = self.config.max_parallel_tasks or (os.cpu_count() or 1)
        for t in self.store.tasks("queued"):
            if len(self._threads) >= limit:
                break
            if t.task_id in self._threads:
                continue
            self.store.set_task_state(t.task_id, "running", bump_attempt=True)
            handle = TaskHandle(on_start=self._pid_recorder(t.task_id))
            self._handles[t.task_id] = handle
            th = threading.Thread(target=self._run_one, args=(t.task_id, t.spec, t.attempt + 1, handle),
                                  name=f"task-{t.task_id}", daemon=True)
            self._threads[t.task_id] = th
            th.start()

    def _pid_recorder(self, task_id: str) -> Callable[[str], None]:
        def record(tag: str) -> None:
            self.store.set_meta(f"pid:{task_id}", tag)

        return record

    def _run_one(self, task_id: str, spec: Mapping[str, Any], attempt: int, handle: TaskHandle) -> None:
        try:
            state, code = run_task(spec, workdir_root=self.config.work_root, attempt=attempt,
                                   emit=self.emit, handle=handle, user=self.config.task_user,
                                   restart_backoff_seconds=self.config.restart_backoff_seconds)
            if state != "interrupted":  # interrupted tasks stay "running" and restart on next start
                self.store.set_task_state(task_id, state, exit_code=code)
        except Exception:  # noqa: BLE001 - a task must never take the agent down
            log.exception("task %s crashed the executor", task_id)
            self.store.set_task_state(task_id, "failed")
        finally:
            self._handles.pop(task_id, None)
            self._threads.pop(task_id, None)
            self._wake.set()

    def recover(self) -> list[str]:
        """Re-queue tasks that were running when the agent last stopped (reboot, SIGKILL)."""
        ids = [t.task_id for t in self.store.tasks("running")]
        for i in ids:
            tag = self.store.get_meta(f"pid:{i}")
            if tag:  # an orphan of a SIGKILLed agent must not run twice; a reused pid is left alone
                kill_task(tag)
            self.store.set_task_state(i, "queued")
        return ids

    # ---- renewal --------------------------------------------------------------------------------
    def maybe_renew(self) -> bool:
        """Renew the device certificate over HTTPS when less than a third of its life remains."""
        cert = pki.load_cert(self.config.path("device.pem"))
        if not pki.needs_renewal(cert) or not self.config.broker_url:
            return False
        from edge.agent.enroll import renew

        renew(self.config, ssl_context=self._ssl_ctx)
        if self._own_transport and self._transport is not None:
            self._transport.close()
            self._transport = self._make_transport()
        return True

    # ---- loop -----------------------------------------------------------------------------------
    def write_status(self) -> None:
        t = self._transport
        status = {"device_id": self.device_id, "connected": bool(t and t.connected), "pid": os.getpid(),
                  "updated": time.time(), "queue": self.store.depth(),
                  "unacked": len(self._unacked), "running": sorted(self._handles),
                  "rejections": dict(self.rejections.counts), "published": self.published}
        tmp = self.config.path("status.json.tmp")
        tmp.write_text(json.dumps(status))
        os.replace(tmp, self.config.path("status.json"))

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        restarted = self.recover()
        if restarted:
            log.info("restarting tasks interrupted by a restart: %s", restarted)
        self._start_ready_tasks()
        if self._transport is None:
            self._transport = self._make_transport()
        next_hb = next_cap = time.monotonic()
        next_status = 0.0
        next_renew = time.monotonic() + 5
        next_bw = time.monotonic()
        try:
            while not self._stop.is_set():
                self._wake.clear()
                self.apply_acks()
                sent = self.pump()
                self._start_ready_tasks()
                now = time.monotonic()
                t = self._transport
                if t is not None and t.connected:
                    if now >= next_hb:
                        self.emit([("heartbeat", {"running": sorted(self._handles), "queue": self.store.depth()},
                                    f"hb-{uuid.uuid4().hex}", True)])
                        next_hb = now + self.config.heartbeat_seconds
                    if now >= next_bw:
                        self.bandwidth_mbps = sysinfo.measure_bandwidth_mbps(self.config.broker_url,
                                                                            ssl_context=self._ssl_ctx)
                        next_bw = now + 3600
                    if now >= next_cap:
                        self._capacity()
                        next_cap = now + self.config.capacity_seconds
                if now >= next_renew:
                    next_renew = now + self.config.renew_check_seconds
                    try:
                        self.maybe_renew()
                    except Exception as exc:  # noqa: BLE001 - retried at the next check
                        log.warning("certificate renewal failed, will retry: %s", exc)
                if now >= next_status:
                    self.write_status()
                    next_status = now + 1.0
                if not sent:
                    self._wake.wait(0.2)
        finally:
            self.write_status()
            if self._own_transport and self._transport is not None:
                self._transport.close()
            for h in list(self._handles.values()):
                h.interrupt()
            for th in list(self._threads.values()):
                th.join(timeout=5)

    def close(self) -> None:
        self.store.close()
