"""The broker's MQTT side: receives every device's uplink, dispatches tasks, keeps the device registry.

* Subscribes with an MQTT 5 **shared subscription** ``$share/<group>/hb/v1/dev/+/up/#`` so several broker
  replicas split the load (each replica: its own ``client_id``, the same ``group``, by default
  :func:`share_group` of the gateway key, which devices cannot guess and so cannot join).
* Every uplink is checked (:mod:`edge.protocol`): size, shape, sender = certificate identity (Mosquitto's
  ACL pins a device to ``hb/v1/dev/<CN>/``, so the topic's device is the authenticated one) = envelope
  device, device known and not revoked, certificate unexpired, signature by the device's registered key,
  timestamp within the window, duplicate id (dropped and re-acknowledged), sequence contiguous (a lower
  seq is a replay; a higher one is a gap: refused, and the ack tells the agent which seq it expects).
  Rejections are counted by reason (:attr:`Gateway.rejections`, and ``hb_edge_rejected_total`` in the
  ``registry`` given, the app's that /metrics serves), logged, and never affect other devices.
* Accepted messages are written idempotently (``edge_uplinks`` keyed by device and message id) in one
  transaction per batch, then acknowledged to the device (``down/ack``), which deletes them from its outbox.
* Keeps Mosquitto's dynamic-security plugin in step with the device registry (:meth:`Gateway.sync_acl`,
  its own thread, every ``acl_sync_s``; a full reconcile against the plugin's lists on every connect and
  every ``acl_full_sync_s``): each enrolled device gets a client with a role confined to its own subtree,
  a revoked device's client is deleted (the plugin disconnects it). The gateway identity administers the
  plugin (``$CONTROL/dynamic-security/v1``). Against a Mosquitto without the plugin (no answer) it logs
  once and retries rarely: access control is then the operator's ACL file.
* :meth:`Gateway.dispatch` sends a task with an expiry; outcomes go to a :class:`TaskSink` exactly once per
  task (the first terminal state wins). A device silent for ``replace_after_s`` loses its unfinished tasks
  (sink state ``LOST``: the scheduler re-places the job) and gets a ``cancel`` for them.

Sink states: ``RUNNING``, ``SUCCEEDED``, ``FAILED``, ``CANCELLED``, ``LOST`` (device offline too long or
task expired undelivered) and ``REFUSED`` (the device refused it, e.g. expired): re-place on the last two.

Design choice: exactly once and in order come from the agent's durable outbox (go-back-N on a gap) plus
contiguous sequence numbers checked against the store's ``last_seq`` — not from MQTT sessions, which
Mosquitto 2.0.11 loses on restart for v5 clients. With several replicas, one device's messages may be
split between them; a message processed out of turn is refused as a gap and re-sent (correct, slower).
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import paho.mqtt.client as mqtt
import sqlalchemy as sa
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from sqlmodel import Session, col, select

from broker.clock import Clock, SystemClock
from broker.devices import OFFLINE_AFTER_SECONDS, EdgeDeviceRow, EdgeTaskRow, UplinkRow
from broker.errors import NotFoundError
from broker.model import JobSpec
from broker.store import Store, utc
from edge import mqttconf, pki, protocol

__all__ = ["Gateway", "TaskSink", "RecordingSink", "task_body", "share_group"]

log = logging.getLogger("broker.gateway")
KICK_WITHIN_SECONDS = 3600.0  # a device revoked this recently has its open MQTT connection ended
CANCEL_RESEND_SECONDS = 86400.0  # a returning device is told again about tasks given up this long ago
_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "lost", "refused"})
_SINK_STATE = {"running": "RUNNING", "succeeded": "SUCCEEDED", "failed": "FAILED", "cancelled": "CANCELLED",
               "lost": "LOST", "refused": "REFUSED"}
def _prom_counters(registry: Any) -> Any:
    """``(rejected, uplinks)`` prometheus counters in ``registry`` (the app's, which /metrics serves), or
    None without a registry or without prometheus-client."""
    if registry is None:
        return None
    try:
        from prometheus_client import Counter
    except ImportError:  # pragma: no cover
        return None
    return (Counter("hb_edge_rejected", "Edge uplink messages refused, by reason", ["reason"], registry=registry),
            Counter("hb_edge_uplinks", "Edge uplink messages stored, by kind", ["kind"], registry=registry))


class TaskSink(Protocol):
    """Where task outcomes go (the scheduler). Called once per state change; never for a late outcome."""

    def task_status(self, job_id: str, state: str, exit_code: int | None, detail: Mapping[str, Any]) -> None: ...


class RecordingSink:
    """A sink that keeps every call (tests, examples, and a default)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int | None, dict[str, Any]]] = []
        self.changed = threading.Condition()

    def task_status(self, job_id: str, state: str, exit_code: int | None, detail: Mapping[str, Any]) -> None:
        with self.changed:
            self.calls.append((job_id, state, exit_code, dict(detail)))
            self.changed.notify_all()

    def wait_for(self, job_id: str, state: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self.changed:
            while not any(c[0] == job_id and c[1] == state for c in self.calls):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
        return True


def task_body(task_id: str, job_id: str, spec: JobSpec, expires_at: datetime) -> dict[str, Any]:
    """The ``task`` downlink for ``spec``: command, env, limits (time from the duration estimate x2, at least
    60 s, or ``spec.activeDeadlineSeconds``; memory = limits.memory or requests, in MiB, at least 64), and
    the spec's ``livenessProbe``/``readinessProbe`` with its ``restartPolicy``, which the agent runs."""
    raw_spec = spec.raw.get("spec", {}) if isinstance(spec.raw, Mapping) else {}
    deadline_s = raw_spec.get("activeDeadlineSeconds") if isinstance(raw_spec, Mapping) else None
    timeout = float(deadline_s) if deadline_s else max(60.0, spec.request.duration_hours * 3600 * 2)
    mem_gib = spec.limits.get("memory") or spec.request.memory_gib
    body = {"task_id": task_id, "job_id": job_id, "command": list(spec.command), "env": dict(spec.env),
            "image": spec.image, "timeout_seconds": timeout, "memory_mib": max(64, int(mem_gib * 1024)),
            "vcpus": spec.request.vcpus,
            "expires_ms": int(expires_at.timestamp() * 1000)}
    if isinstance(raw_spec, Mapping):  # the agent runs the probes (validated at submission) next to the task
        probes = {k: raw_spec[k] for k in ("livenessProbe", "readinessProbe") if raw_spec.get(k) is not None}
        if probes:
            body["probes"] = probes
            body["restart_policy"] = str(raw_spec.get("restartPolicy") or "OnFailure")
    return body


def share_group(key: ec.EllipticCurvePrivateKey) -> str:
    """The gateway replicas' shared-subscription group: derived from the gateway key they all hold, so a
    device cannot guess it. Mosquitto 2.0's ACL file does not check SUBSCRIBE at all (only delivery, by
    the message topic), so a device may subscribe to ``$share/<group>/...``: with a known group it would
    take a share of every uplink (never delivered to it, but lost for the gateway)."""
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return "hb-gw-" + hashlib.sha256(b"hb-gateway-share-group\0" + der).hexdigest()[:32]


def _field(body: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    """``body[key]`` checked to be a ``kind`` (``float`` accepts ints; bools are never numbers), else
    ``default`` when absent or null; a present value of another type raises ``Rejected(malformed)``."""
    v = body.get(key)
    if v is None:
        return default
    ok = isinstance(v, (int, float) if kind is float else kind) and not (kind is not bool and isinstance(v, bool))
    if not ok or (kind is float and v != v):
        raise protocol.Rejected(protocol.MALFORMED, f"body field {key!r} is not {kind.__name__}")
    return float(v) if kind is float else v


@dataclass
class _Accepted:
    device: str
    env: protocol.Envelope


class Gateway:
    """One gateway replica. ``start()`` connects and runs the worker thread; ``stop()`` ends both."""

    def __init__(
        self,
        store: Store,
        *,
        host: str,
        port: int,
        ca_file: str,
        cert_file: str,
        key_file: str,
        sink: TaskSink | None = None,
        clock: Clock | None = None,
        group: str | None = None,
        client_id: str | None = None,
        window_s: float = protocol.WINDOW_SECONDS,
        max_payload_bytes: int = protocol.MAX_PAYLOAD_BYTES,
        offline_after_s: float = OFFLINE_AFTER_SECONDS,
        replace_after_s: float = 300.0,
        batch: int = 1000,
        inbox_max: int = 20_000,
        registry: Any = None,
        uplink_retention_s: float = 7 * 86400,
        acl_sync_s: float = 1.0,
        acl_full_sync_s: float = 60.0,
    ) -> None:
        self.store = store
        self.sink: TaskSink = sink or RecordingSink()
        self.clock = clock or SystemClock()
        self._key = pki.load_key(key_file)
        self.group = group or share_group(self._key)
        self.window_ms = int(window_s * 1000)
        self.max_payload_bytes = max_payload_bytes
        self.offline_after_s = offline_after_s
        self.replace_after_s = replace_after_s
        self.batch = batch
        self._prom = _prom_counters(registry)
        self.uplink_retention_s = uplink_retention_s
        self.rejections = protocol.RejectionCounter(on_reject=self._count_prom)
        self.accepted = 0
        self.duplicates = 0
        # Bounded: when the worker falls behind, paho's network thread waits here and Mosquitto holds the
        # rest (QoS 1 flow control) instead of this process's memory growing without end.
        self._inbox: queue.Queue[tuple[str, bytes, int]] = queue.Queue(maxsize=inbox_max)
        self._stop = threading.Event()
        self._connected = threading.Event()
        # Downlink seqs: one counter per replica, started at the wall clock (so agents of older versions,
        # which require rising seqs, accept a restarted gateway) and never read from the clock again.
        self._down_seq = time.time_ns() // 1000
        self._seq_lock = threading.Lock()
        self._pubkeys: dict[str, ec.EllipticCurvePublicKey] = {}  # cert serial -> key
        self._worker: threading.Thread | None = None
        self._last_check = 0.0
        cid = client_id or f"hb-gateway-{socket.gethostname()}"
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=MQTTProtocolVersion.MQTTv5)
        c.tls_set(ca_certs=ca_file, certfile=cert_file, keyfile=key_file, tls_version=ssl.PROTOCOL_TLS_CLIENT)
        c.max_inflight_messages_set(200)
        c.max_queued_messages_set(0)
        c.reconnect_delay_set(1, 2)
        c.on_connect = self._on_connect
        c.on_disconnect = lambda *_a: self._connected.clear()
        c.on_message = self._on_message
        self._client = c
        self._host, self._port = host, port
        self._tls = (ca_file, cert_file, key_file)
        self._last_prune = 0.0
        self._kicked: set[str] = set()
        # Dynamic-security sync: what this replica knows the plugin holds (None: reconcile in full).
        self.acl_sync_s, self.acl_full_sync_s = acl_sync_s, acl_full_sync_s
        self._acl_applied: set[str] | None = None
        self._acl_full_at = 0.0
        self.acl_managed: bool | None = None  # None: not yet known; False: Mosquitto has no plugin
        self._acl_failures = 0  # plugin requests in a row that got no answer: retried after 2, 4, ... 300 s
        self._ctl_lock = threading.Lock()
        self._ctl_waiting: dict[str, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self._acl_thread: threading.Thread | None = None
        self._acl_wake = threading.Event()

    # ---- lifecycle ------------------------------------------------------------------------------
    def _count_prom(self, reason: str) -> None:
        if self._prom:
            self._prom[0].labels(reason=reason).inc()

    def _on_connect(self, client: mqtt.Client, _u: Any, _f: Any, reason_code: Any, _p: Any) -> None:
        if getattr(reason_code, "is_failure", False):
            log.error("gateway connect refused: %s", reason_code)
            return
        client.subscribe([(f"$share/{self.group}/{protocol.TOPIC_ROOT}/+/up/#", 1),
                          (mqttconf.DYNSEC_RESPONSE_TOPIC, 0)])
        self._acl_applied = None  # Mosquitto may have restarted from an older state: reconcile in full
        self._connected.set()
        self._acl_wake.set()

    def _on_message(self, _c: Any, _u: Any, m: Any) -> None:
        if m.topic == mqttconf.DYNSEC_RESPONSE_TOPIC:
            self._on_control_response(bytes(m.payload))
        else:
            self._inbox.put((m.topic, bytes(m.payload), self._now_ms()))

    def start(self, wait_s: float = 10.0) -> None:
        """Connect (clean start, session kept 1 h), subscribe, and start processing; waits until connected."""
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self._client.connect_async(self._host, self._port, keepalive=30, clean_start=False, properties=props)
        self._client.loop_start()
        self._worker = threading.Thread(target=self._work, name="gateway-worker", daemon=True)
        self._worker.start()
        self._acl_thread = threading.Thread(target=self._acl_loop, name="gateway-acl", daemon=True)
        self._acl_thread.start()
        if not self._connected.wait(wait_s):
            raise ConnectionError(f"gateway could not connect to mqtts://{self._host}:{self._port} in {wait_s} s. "
                                  "To fix: check BROKER_MQTT_URL and the gateway certificate")

    def stop(self) -> None:
        self._stop.set()
        self._acl_wake.set()
        if self._worker is not None:
            self._worker.join(timeout=10)
        if self._acl_thread is not None:
            self._acl_thread.join(timeout=10)
        self._client.disconnect()
        self._client.loop_stop()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    # ---- downlink -------------------------------------------------------------------------------
    def _next_seq(self) -> int:
        with self._seq_lock:
            self._down_seq += 1
            return self._down_seq

    def send(self, device_id: str, kind: str, body: Mapping[str, Any], *, expiry_s: float | None = None,
             id: str | None = None) -> None:
        """Sign and publish one downlink (QoS 1) to ``device_id``."""
        payload = protocol.seal(kind, body, device=device_id, seq=self._next_seq(), key=self._key, id=id)
        props = None
        if expiry_s is not None:
            props = Properties(PacketTypes.PUBLISH)
            props.MessageExpiryInterval = max(1, int(expiry_s))
        self._client.publish(protocol.down_topic(device_id, kind), payload, qos=1, properties=props)

    def dispatch(self, device_id: str, job_id: str, spec: JobSpec, expires_at: datetime) -> None:
        """Send ``spec`` to ``device_id`` as a new task (id ``<job_id>.<n>``) that the device refuses after
        ``expires_at``. Raises :class:`NotFoundError` for an unknown or revoked device."""
        now = self.clock.now()
        with self.store.tx() as s:
            dev = s.get(EdgeDeviceRow, device_id)
            if dev is None or dev.revoked_at is not None:
                raise NotFoundError(f"edge device {device_id!r} not found or revoked. To fix: place the job "
                                    "on an enrolled device (broker devices list)")
            n = s.exec(select(sa.func.count()).select_from(EdgeTaskRow).where(EdgeTaskRow.job_id == job_id)).one()
            task_id = f"{job_id}.{int(n) + 1}"
            body = task_body(task_id, job_id, spec, expires_at)
            s.add(EdgeTaskRow(task_id=task_id, job_id=job_id, device_id=device_id, state="dispatched",
                              body=json.dumps(body), expires_at=expires_at, dispatched_at=now, updated_at=now))
        self.send(device_id, "task", body, expiry_s=(expires_at - now).total_seconds(), id=task_id)

    def _redispatch(self, s: Session, device_id: str, now: datetime) -> list[tuple[str, dict[str, Any]]]:
        """What a device that says hello is owed: its undelivered tasks again, and a ``cancel`` for each of
        its tasks given up (lost, cancelled) within :data:`CANCEL_RESEND_SECONDS`, so a device returning
        from a long absence does not run a task the broker already re-placed (cancels are idempotent)."""
        since = now - timedelta(seconds=CANCEL_RESEND_SECONDS)
        rows = s.exec(select(EdgeTaskRow).where(EdgeTaskRow.device_id == device_id,
                                                col(EdgeTaskRow.state).in_(("dispatched", "lost", "cancelled")))).all()
        out: list[tuple[str, dict[str, Any]]] = []
        for r in rows:
            if r.state == "dispatched" and utc(r.expires_at) > now:
                out.append(("task", json.loads(r.body)))
            elif r.state != "dispatched" and utc(r.updated_at) >= since:
                out.append(("cancel", {"task_id": r.task_id}))
        return out

    # ---- access control (Mosquitto's dynamic-security plugin) ------------------------------------
    def _on_control_response(self, payload: bytes) -> None:
        try:
            responses = json.loads(payload).get("responses", [])
        except (ValueError, AttributeError):
            return
        if not isinstance(responses, list):
            return
        for r in responses:
            corr = r.get("correlationData") if isinstance(r, dict) else None
            with self._ctl_lock:
                waiting = self._ctl_waiting.get(corr) if isinstance(corr, str) else None
            if waiting is not None:
                waiting[1].append(r)
                waiting[0].set()

    def control(self, commands: list[dict[str, Any]], timeout_s: float = 5.0) -> list[dict[str, Any]] | None:
        """Send dynamic-security ``commands`` and return the plugin's responses in order, or ``None`` when
        they do not all come back within ``timeout_s`` (not connected, or no plugin in Mosquitto)."""
        if not commands:
            return []
        corr = uuid.uuid4().hex
        ids = [f"{corr}.{i}" for i in range(len(commands))]
        got: list[dict[str, Any]] = []
        ev = threading.Event()
        with self._ctl_lock:
            for i in ids:
                self._ctl_waiting[i] = (ev, got)
        try:
            body = {"commands": [{**c, "correlationData": i} for c, i in zip(commands, ids, strict=True)]}
            self._client.publish(mqttconf.DYNSEC_TOPIC, json.dumps(body), qos=1)
            end = time.monotonic() + timeout_s
            while len(got) < len(ids):
                if not ev.wait(max(0.0, end - time.monotonic())):
                    return None
                ev.clear()
        finally:
            with self._ctl_lock:
                for i in ids:
                    self._ctl_waiting.pop(i, None)
        order = {i: n for n, i in enumerate(ids)}
        return sorted(got, key=lambda r: order[r["correlationData"]])

    def _acl_loop(self) -> None:
        while not self._stop.is_set():
            # no answer yet (no plugin, or the first request raced the response subscription right after a
            # connect): retried soon, then less often, never given up
            self._acl_wake.wait(self.acl_sync_s if self.acl_managed is not False
                                else min(300.0, 2.0 ** self._acl_failures))
            self._acl_wake.clear()
            if self._stop.is_set() or not self._connected.is_set():
                continue
            try:
                self.sync_acl()
            except Exception:  # noqa: BLE001 - retried at the next round
                log.exception("device ACL sync failed")

    def _desired_devices(self) -> set[str]:
        with self.store.read() as s:
            return set(s.exec(select(EdgeDeviceRow.id).where(EdgeDeviceRow.revoked_at == None)).all())  # noqa: E711

    def sync_acl(self, *, full: bool = False) -> tuple[int, int] | None:
        """Bring the plugin's device clients in step with the registry: grant every enrolled device, delete
        every revoked (or unknown) one the plugin holds. In full (``listRoles``/``listClients``) after a
        connect, every ``acl_full_sync_s`` and when asked; else against what this replica applied last.
        Returns ``(granted, revoked)``, or ``None`` when the plugin did not answer."""
        desired = self._desired_devices()
        full = full or self._acl_applied is None or time.monotonic() - self._acl_full_at >= self.acl_full_sync_s
        if full:
            lists = self.control([{"command": "listRoles", "count": -1}, {"command": "listClients", "count": -1}])
            if lists is None or any("error" in r for r in lists):
                if self.acl_managed is not False:
                    log.warning("Mosquitto's dynamic-security plugin did not answer (%s): device access is "
                                "left to Mosquitto's own ACL. To fix: generate the config with `broker mqtt "
                                "config`", "no response" if lists is None else lists)
                self.acl_managed = False
                self._acl_failures += 1
                return None
            roles = {r for r in lists[0].get("data", {}).get("roles", []) if isinstance(r, str)}
            clients = {c for c in lists[1].get("data", {}).get("clients", []) if isinstance(c, str)}
            prefix = mqttconf.DEVICE_ROLE_PREFIX
            managed = {r[len(prefix):] for r in roles if r.startswith(prefix)}
            have = managed & clients
            self._acl_full_at = time.monotonic()
        else:
            managed = have = self._acl_applied or set()
        grant, revoke = sorted(desired - have), sorted(managed - desired)
        commands = [c for d in grant for c in mqttconf.device_grant_commands(d)]
        commands += [c for d in revoke for c in mqttconf.device_revoke_commands(d)]
        for i in range(0, len(commands), 200):
            answers = self.control(commands[i:i + 200])
            if answers is None:
                self._acl_applied = None
                return None
            for a in answers:
                err = a.get("error")
                if err and "already exists" not in err and "not found" not in err:
                    log.warning("dynamic-security %s failed: %s", a.get("command"), err)
        if self.acl_managed is not True:
            log.info("device access is managed in Mosquitto's dynamic-security plugin")
        self.acl_managed = True
        self._acl_failures = 0
        self._acl_applied = desired
        if grant or revoke:
            log.info("device ACL sync: %d granted, %d revoked", len(grant), len(revoke))
        return len(grant), len(revoke)

    # ---- uplink ---------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                first = self._inbox.get(timeout=0.2)
            except queue.Empty:
                self._maybe_check()
                continue
            batch = [first]
            while len(batch) < self.batch:
                try:
                    batch.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            self.process_isolated(batch)
            self._maybe_check()

    def process_isolated(self, batch: list[tuple[Any, ...]]) -> int:
        """:meth:`process`; when the batch fails as a whole, each message again on its own, so a message
        that breaks processing costs only its sender (counted as ``malformed``), never the other devices."""
        try:
            return self.process(batch)
        except Exception:  # noqa: BLE001 - never let one bad message stop the gateway or its batch
            if len(batch) == 1:
                log.exception("uplink on %s could not be processed", batch[0][0])
                self.rejections.add(protocol.MALFORMED)
                return 0
            log.warning("gateway batch of %d failed; processing its messages one by one", len(batch))
        return sum(self.process_isolated([m]) for m in batch)

    def _maybe_check(self) -> None:
        if time.monotonic() - self._last_check >= 5.0:
            self._last_check = time.monotonic()
            try:
                self.check_devices()
            except Exception:  # noqa: BLE001
                log.exception("device check failed")

    def _reject(self, reason: str, topic: str, detail: str) -> None:
        self.rejections.add(reason)
        log.warning("uplink rejected (%s) on %s: %s", reason, topic, detail[:200])

    def _pubkey(self, dev: EdgeDeviceRow) -> ec.EllipticCurvePublicKey:
        key = self._pubkeys.get(dev.cert_serial)
        if key is None:
            pub = pki.load_cert(dev.cert_pem).public_key()
            assert isinstance(pub, ec.EllipticCurvePublicKey)
            self._pubkeys[dev.cert_serial] = key = pub
        return key

    def _now_ms(self) -> int:
        return int(self.clock.now().timestamp() * 1000)

    def process(self, batch: list[tuple[Any, ...]]) -> int:
        """Check, store and acknowledge one batch of ``(topic, payload[, received ms])`` uplinks; returns how
        many were stored. The time window is checked against when a message was received (a gateway that
        fell behind must not refuse, as stale, messages that were on time: they would be re-sent forever).

        One transaction for the batch; side effects (acks, sink calls, re-dispatch) run after the commit."""
        now = self.clock.now()
        now_ms = int(now.timestamp() * 1000)
        parsed: list[tuple[str, str, protocol.Envelope, int]] = []
        for item in batch:
            topic, payload = item[0], item[1]
            received_ms = int(item[2]) if len(item) > 2 else now_ms
            try:
                device, direction, kind = protocol.parse_topic(topic)
                if direction != "up":
                    raise protocol.Rejected(protocol.MALFORMED, "not an uplink topic")
                env = protocol.open_envelope(payload, max_bytes=self.max_payload_bytes)
                if env.kind != kind or kind not in protocol.UP_KINDS:
                    raise protocol.Rejected(protocol.MALFORMED, f"kind {env.kind!r} on topic kind {kind!r}")
                if env.device != device:
                    raise protocol.Rejected(protocol.IDENTITY, f"envelope device {env.device!r} on {device!r}")
            except protocol.Rejected as rej:
                self._reject(rej.reason, topic, rej.detail)
                continue
            parsed.append((topic, device, env, received_ms))
        if not parsed:
            return 0
        acks: dict[str, list[str]] = {}
        expect: dict[str, int] = {}
        effects: list[tuple[str, str, int | None, dict[str, Any]]] = []
        redispatch: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        stored = 0
        kinds: dict[str, int] = {}
        with self.store.tx() as s:
            ids_by_dev: dict[str, list[str]] = {}
            for _t, d, e, _r in parsed:
                ids_by_dev.setdefault(d, []).append(e.id)
            devs = {d.id: d for d in s.exec(select(EdgeDeviceRow).where(col(EdgeDeviceRow.id).in_(ids_by_dev)))}
            seen: set[tuple[str, str]] = set()
            for d, ids in ids_by_dev.items():
                for chunk_start in range(0, len(ids), 500):
                    chunk = ids[chunk_start:chunk_start + 500]
                    q = select(UplinkRow.msg_id).where(UplinkRow.device_id == d, col(UplinkRow.msg_id).in_(chunk))
                    seen.update((d, m) for m in s.exec(q).all())
            rows: list[dict[str, Any]] = []
            last_seq = {d: dev.last_seq for d, dev in devs.items()}  # ORM attribute writes are slow: once/batch
            for topic, d, env, received_ms in parsed:
                dev = devs.get(d)
                try:
                    if dev is None:
                        raise protocol.Rejected(protocol.UNKNOWN_SENDER, f"device {d!r} is not enrolled")
                    if dev.revoked_at is not None:
                        raise protocol.Rejected(protocol.REVOKED, f"device {d!r} is revoked")
                    if utc(dev.cert_not_after) <= now:
                        raise protocol.Rejected(protocol.REVOKED, f"device {d!r} certificate expired")
                    protocol.verify_signature(env, self._pubkey(dev))
                    if abs(env.ts - received_ms) > self.window_ms:
                        raise protocol.Rejected(protocol.STALE,
                                                f"ts is {abs(env.ts - received_ms) / 1000:.0f} s off")
                    last = last_seq[d]
                    if (d, env.id) in seen:
                        # A re-send, or a re-run's re-emitted result under a new seq (kill -9 mid-task).
                        # Acknowledged only once the window has reached it, and the window moves past it:
                        # acking one beyond a gap would leave a hole the agent can never fill again.
                        self.duplicates += 1
                        if env.seq == last + 1:
                            last_seq[d] = env.seq
                        elif env.seq > last + 1:
                            expect[d] = last + 1
                            raise protocol.Rejected(protocol.GAP, f"seq {env.seq}, expected {last + 1}")
                        acks.setdefault(d, []).append(env.id)
                        raise protocol.Rejected(protocol.DUPLICATE, f"id {env.id}")
                    if env.seq <= last:
                        raise protocol.Rejected(protocol.REPLAY, f"seq {env.seq} <= {last}")
                    if env.seq != last + 1:
                        # Uplink seqs are contiguous: something before this one was lost on the way (e.g.
                        # published while no gateway was subscribed). Refuse; the agent goes back and re-sends.
                        expect[d] = last + 1
                        raise protocol.Rejected(protocol.GAP, f"seq {env.seq}, expected {last + 1}")
                except protocol.Rejected as rej:
                    if rej.reason in (protocol.DUPLICATE, protocol.GAP):
                        self.rejections.add(rej.reason)  # redelivery / loss upstream: counted, not a threat
                    else:
                        self._reject(rej.reason, topic, rej.detail)
                    continue
                assert dev is not None
                seen.add((d, env.id))
                last_seq[d] = env.seq
                rows.append({"device_id": d, "msg_id": env.id, "seq": env.seq, "kind": env.kind, "ts_ms": env.ts,
                             "body": json.dumps(env.body, separators=(",", ":")), "received_at": now})
                acks.setdefault(d, []).append(env.id)
                kinds[env.kind] = kinds.get(env.kind, 0) + 1
                try:
                    self._apply(s, dev, env, now, effects, redispatch)
                except protocol.Rejected as rej:
                    # Signed and in sequence, but its body is unusable: the window moves on (or the device
                    # would wedge itself re-sending it), nothing is applied, and it is counted.
                    self._reject(rej.reason, topic, rej.detail)
            if rows:
                s.execute(sa.insert(UplinkRow), rows)
                stored = len(rows)
            for d, dev in devs.items():
                if last_seq[d] != dev.last_seq:
                    dev.last_seq, dev.last_seen, dev.online = last_seq[d], now, True
                    s.add(dev)
        self.accepted += stored
        if self._prom:
            for k, n in kinds.items():
                self._prom[1].labels(kind=k).inc(n)
        for d in set(acks) | set(expect):
            ids = acks.get(d, [])
            for i in range(0, max(len(ids), 1), 1000):
                body: dict[str, Any] = {"ids": ids[i:i + 1000]}
                if d in expect and i == 0:
                    body["expect"] = expect[d]
                self.send(d, "ack", body)
        for d, owed in redispatch.items():
            for kind, b in owed:
                if kind == "task":
                    self.send(d, "task", b, expiry_s=(b["expires_ms"] - now_ms) / 1000, id=str(b["task_id"]))
                else:
                    self.send(d, kind, b)
        for job_id, state, code, detail in effects:
            try:
                self.sink.task_status(job_id, state, code, detail)
            except Exception:  # noqa: BLE001 - the scheduler's problem must not stop the gateway
                log.exception("task sink failed for job %s", job_id)
        return stored

    def _apply(self, s: Session, dev: EdgeDeviceRow, env: protocol.Envelope, now: datetime,
               effects: list[tuple[str, str, int | None, dict[str, Any]]],
               redispatch: dict[str, list[tuple[str, dict[str, Any]]]]) -> None:
        """Apply one accepted uplink. Every field is checked before anything changes: a wrong type raises
        :class:`protocol.Rejected` (``malformed``) with the device row and the task untouched."""
        b = env.body
        if env.kind == "hello":
            version = _field(b, "agent_version", str, "")[:32]
            dev.agent_version = version or dev.agent_version
            redispatch[dev.id] = self._redispatch(s, dev.id, now)
        elif env.kind == "capacity":
            link = _field(b, "link", Mapping, {})
            values = {"vcpus": _field(b, "vcpus", float, 0.0), "memory_gib": _field(b, "memory_gib", float, 0.0),
                      "gpus": int(_field(b, "gpus", int, 0)), "arch": _field(b, "arch", str, "amd64")[:16],
                      "disk_gib": _field(b, "disk_gib", float, 0.0)}
            version = _field(b, "agent_version", str, "")[:32]
            latency = _field(link, "latency_ms", float, None)
            bandwidth = _field(link, "bandwidth_mbps", float, None)
            for k, v in values.items():
                setattr(dev, k, v)
            dev.agent_version = version or dev.agent_version
            if latency is not None:
                dev.latency_ms = latency
            if bandwidth is not None:
                dev.bandwidth_mbps = bandwidth
        elif env.kind == "status" or (env.kind == "result" and b.get("final")):  # partial results: stored only
            task_id = _field(b, "task_id", str, "")
            state = _field(b, "state", str, "")
            code = _field(b, "exit_code", int, None)
            task = s.get(EdgeTaskRow, task_id) if task_id else None
            if task is None or task.device_id != dev.id:
                return
            if state in ("probe", "restarted"):  # the agent's probe results (see edge.agent.executor)
                report = {"task_id": task_id, "device": dev.id, "probe": _field(b, "probe", str, "")[:16],
                          "ok": _field(b, "ok", bool, False), "failures": _field(b, "failures", int, 0),
                          "successes": _field(b, "successes", int, 0), "ready": _field(b, "ready", bool, False),
                          "message": _field(b, "message", str, "")[:500], "restarts": _field(b, "restarts", int, 0),
                          "restarted": state == "restarted"}
                if task.state in ("dispatched", "running") and report["probe"] in ("liveness", "readiness"):
                    effects.append((task.job_id, "PROBE", None, report))
                return
            if state == "running" and task.state == "dispatched":
                task.state, task.updated_at = "running", now
                effects.append((task.job_id, "RUNNING", None, {"task_id": task_id, "device": dev.id}))
            elif state in ("succeeded", "failed", "cancelled", "refused"):
                if task.state in _TERMINAL:
                    task.late_outcome = state  # never report a job's outcome twice
                else:
                    task.state, task.exit_code, task.updated_at = state, code, now
                    effects.append((task.job_id, _SINK_STATE[state], code,
                                    {"task_id": task_id, "device": dev.id, **{k: b[k] for k in b
                                     if k in ("error", "stdout_tail", "stderr_tail", "results", "reason")}}))
            s.add(task)

    # ---- registry upkeep ------------------------------------------------------------------------
    def check_devices(self) -> None:
        """Mark silent devices offline; give up on tasks of devices silent for ``replace_after_s`` and on
        tasks that expired undelivered (sink ``LOST``), sending a ``cancel`` to the device."""
        now = self.clock.now()
        off = now - timedelta(seconds=self.offline_after_s)
        lost_before = now - timedelta(seconds=self.replace_after_s)
        effects: list[tuple[str, str, int | None, dict[str, Any]]] = []
        cancels: list[tuple[str, str]] = []
        with self.store.tx() as s:
            for dev in s.exec(select(EdgeDeviceRow).where(EdgeDeviceRow.online == True)).all():  # noqa: E712
                if dev.last_seen is None or utc(dev.last_seen) < off:
                    dev.online = False
                    s.add(dev)
            recently = now - timedelta(seconds=KICK_WITHIN_SECONDS)
            kicks = [d for d in s.exec(select(EdgeDeviceRow.id).where(col(EdgeDeviceRow.revoked_at) >= recently))
                     if d not in self._kicked]
            open_tasks = s.exec(select(EdgeTaskRow).where(col(EdgeTaskRow.state).in_(("dispatched", "running"))))
            for t in open_tasks.all():
                owner = s.get(EdgeDeviceRow, t.device_id)
                silent = owner is None or owner.last_seen is None or utc(owner.last_seen) < lost_before
                gone = owner is None or owner.revoked_at is not None
                undelivered = t.state == "dispatched" and utc(t.expires_at) <= now
                if (silent and utc(t.dispatched_at) < lost_before) or gone or undelivered:
                    reason = "expired" if undelivered else "revoked" if gone else "device offline"
                    t.state, t.updated_at = "lost", now
                    s.add(t)
                    effects.append((t.job_id, "LOST", None, {"task_id": t.task_id, "device": t.device_id,
                                                             "reason": reason}))
                    cancels.append((t.device_id, t.task_id))
        for device_id, task_id in cancels:
            self.send(device_id, "cancel", {"task_id": task_id})
        for device_id in kicks:
            self._kicked.add(device_id)  # once per replica
            self.kick(device_id)
        for e in effects:
            self.sink.task_status(*e)
        self._prune(now)

    def kick(self, device_id: str, timeout_s: float = 5.0) -> bool:
        """End ``device_id``'s open MQTT connection: connect once with its client id (Mosquitto closes the
        older connection of a client id, "session takeover") and leave. Mosquitto checks the CRL only at the
        TLS handshake, so this is what makes a revocation (with the CRL reloaded) lock a connected device out.
        Returns whether the takeover connection was made."""
        done = threading.Event()
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device_id, clean_session=True,
                        protocol=MQTTProtocolVersion.MQTTv311)
        c.tls_set(ca_certs=self._tls[0], certfile=self._tls[1], keyfile=self._tls[2],
                  tls_version=ssl.PROTOCOL_TLS_CLIENT)
        c.on_connect = lambda *_a: done.set()
        try:
            c.connect(self._host, self._port, keepalive=10)
            c.loop_start()
            ok = done.wait(timeout_s)
            c.disconnect()
            c.loop_stop()
        except (OSError, ssl.SSLError) as exc:
            log.warning("could not end the MQTT connection of revoked device %s: %s", device_id, exc)
            return False
        log.info("ended the MQTT connection of revoked device %s", device_id)
        return ok

    def _prune(self, now: datetime) -> int:
        """Delete stored uplinks older than ``uplink_retention_s`` (at most once a minute), so the
        received-message table stays bounded. A task's outcome is copied into its job's event when it
        settles; dedupe of a re-sent id needs the row only while the device may still re-send it."""
        if now.timestamp() - self._last_prune < 60 or self.uplink_retention_s <= 0:
            return 0
        self._last_prune = now.timestamp()
        cutoff = now - timedelta(seconds=self.uplink_retention_s)
        table = UplinkRow.__table__  # type: ignore[attr-defined]
        with self.store.tx() as s:
            n = getattr(s.execute(sa.delete(table).where(table.c.received_at < cutoff)), "rowcount", 0)
        if n:
            log.info("pruned %d uplinks received before %s", n, cutoff.isoformat())
        return int(n or 0)
