"""The agent's MQTT seam: ``publish(topic, payload)``, ``close()``, ``connected``.

Design choice: the agent speaks MQTT 3.1.1 with ``clean_session=False`` because, with Debian's
Mosquitto 2.0.11, only v3.1.1 sessions survive a broker restart (RECIPES §5.6); durability of the
uplink does not depend on it anyway (the SQLite outbox re-sends until the gateway acknowledges).
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

__all__ = ["Transport", "MqttTransport"]

log = logging.getLogger("edge.agent")


class Transport(Protocol):
    @property
    def connected(self) -> bool: ...

    def publish(self, topic: str, payload: bytes) -> None: ...

    def close(self) -> None: ...


# A refused SUBSCRIBE (a device the access control does not know yet) is retried at least this often.
SUBSCRIBE_RETRY_MAX_SECONDS = 5.0


class MqttTransport:
    """A paho client with mutual TLS that keeps reconnecting (backoff 1 s doubling up to
    ``reconnect_max_seconds``) until closed.

    ``on_message(topic, payload)`` and ``on_state(connected)`` run on paho's network thread.
    ``latency_ms`` is an EWMA of PUBACK round trips (QoS 1), i.e. the measured link latency.

    ``connected`` (and ``on_state(True)``) means connected *and* subscribed: Mosquitto's access control
    (the dynamic-security plugin, which the gateway fills from the device registry) refuses a device's
    SUBSCRIBE until the device is known to it, e.g. for a moment after enrollment; a refused SUBACK is
    retried after 1 s, doubling up to :data:`SUBSCRIBE_RETRY_MAX_SECONDS` (a cheap request: the device gets in
    within seconds of the gateway knowing it), and nothing is published meanwhile.

    On every (re)connect the messages paho still holds are discarded, under :attr:`send_lock`, before
    ``on_state(True)`` runs: the caller's durable outbox re-sends from its oldest unacknowledged message,
    so the receiver sees one ordered stream (paho's own re-send of newer messages first would leave a gap
    behind messages that Mosquitto acknowledged but lost, e.g. in a restart). Publish under ``send_lock``.
    """

    def __init__(
        self,
        *,
        client_id: str,
        host: str,
        port: int,
        ca_file: str,
        cert_file: str,
        key_file: str,
        subscribe: str,
        on_message: Callable[[str, bytes], None],
        on_state: Callable[[bool], None] = lambda _c: None,
        inflight: int = 100,
        reconnect_max_seconds: int = 30,
    ) -> None:
        self._subscribe = subscribe
        self._on_message = on_message
        self._on_state = on_state
        self._connected = threading.Event()
        self._sub_mid: int | None = None
        # held while a SUBSCRIBE is sent and its mid recorded: a retry is sent from a timer thread, and its
        # SUBACK can reach the network thread before ``subscribe()`` has returned the mid
        self._sub_lock = threading.Lock()
        self._sub_delay = 1.0
        self._reconnect_max = max(1, reconnect_max_seconds)
        self._retry: threading.Timer | None = None
        self.subscribe_refusals = 0
        self.send_lock = threading.RLock()
        self._sent_at: dict[int, float] = {}
        self.latency_ms: float | None = None
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False,
                        protocol=MQTTProtocolVersion.MQTTv311)
        c.tls_set(ca_certs=ca_file, certfile=cert_file, keyfile=key_file, tls_version=ssl.PROTOCOL_TLS_CLIENT)
        c.max_inflight_messages_set(inflight)
        c.max_queued_messages_set(0)
        c.reconnect_delay_set(1, max(1, reconnect_max_seconds))
        c.on_connect = self._handle_connect
        c.on_disconnect = self._handle_disconnect
        c.on_message = lambda _c, _u, msg: self._on_message(msg.topic, bytes(msg.payload))
        c.on_publish = self._handle_publish
        c.on_subscribe = self._handle_subscribe
        self._client = c
        c.connect_async(host, port, keepalive=30)
        c.loop_start()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def _handle_connect(self, client: mqtt.Client, _u: Any, _flags: Any, reason_code: Any, _p: Any) -> None:
        if getattr(reason_code, "is_failure", False):
            return
        with self.send_lock:
            self._drop_paho_queue(client)
        self._sub_delay = 1.0
        self._send_subscribe(client)

    def _send_subscribe(self, client: mqtt.Client) -> None:
        with self._sub_lock:
            self._sub_mid = client.subscribe(self._subscribe, qos=1)[1]

    def _handle_subscribe(self, client: mqtt.Client, _u: Any, mid: int, reason_codes: Any, _p: Any) -> None:
        with self._sub_lock:
            if mid != self._sub_mid:
                return
        if any(getattr(rc, "is_failure", False) for rc in reason_codes):
            self.subscribe_refusals += 1
            log.warning("mqtt subscribe to %s refused (%s); retrying in %.0f s", self._subscribe,
                        ", ".join(str(rc) for rc in reason_codes), self._sub_delay)
            self._retry = threading.Timer(self._sub_delay, self._resubscribe, args=(client,))
            self._retry.daemon = True
            self._retry.start()
            self._sub_delay = min(2 * self._sub_delay, self._reconnect_max, SUBSCRIBE_RETRY_MAX_SECONDS)
            return
        with self.send_lock:
            self._on_state(True)
            self._connected.set()

    def _resubscribe(self, client: mqtt.Client) -> None:
        if client.is_connected() and not self._connected.is_set():
            self._send_subscribe(client)

    @staticmethod
    def _drop_paho_queue(client: mqtt.Client) -> None:
        # paho-mqtt 2.x internals (pinned by pyproject): paho re-sends these right after on_connect returns.
        mutex = getattr(client, "_out_message_mutex", None)
        out = getattr(client, "_out_messages", None)
        if mutex is None or out is None:  # pragma: no cover - another paho version
            return
        with mutex:
            out.clear()
            client._inflight_messages = 0

    def _handle_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, _rc: Any, _p: Any) -> None:
        was = self._connected.is_set()
        self._connected.clear()
        self._sent_at.clear()
        if was:
            self._on_state(False)

    def _handle_publish(self, _c: mqtt.Client, _u: Any, mid: int, _rc: Any, _p: Any) -> None:
        t0 = self._sent_at.pop(mid, None)
        if t0 is not None:
            rtt = (time.perf_counter() - t0) * 1000
            self.latency_ms = rtt if self.latency_ms is None else 0.9 * self.latency_ms + 0.1 * rtt

    def publish(self, topic: str, payload: bytes) -> None:
        info = self._client.publish(topic, payload, qos=1)
        if info.mid % 64 == 0:  # sample: a dict entry per message would cost more than it tells
            self._sent_at[info.mid] = time.perf_counter()

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        try:
            self._client.disconnect()
        finally:
            self._client.loop_stop()
