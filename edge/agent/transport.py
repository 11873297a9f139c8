"""The agent's MQTT seam: ``publish(topic, payload)``, ``close()``, ``connected``.

Design choice: the agent speaks MQTT 3.1.1 with ``clean_session=False`` because, with Debian's
Mosquitto 2.0.11, only v3.1.1 sessions survive a broker restart (RECIPES §5.6); durability of the
uplink does not depend on it anyway (the SQLite outbox re-sends until the gateway acknowledges).
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

__all__ = ["Transport", "MqttTransport"]


class Transport(Protocol):
    @property
    def connected(self) -> bool: ...

    def publish(self, topic: str, payload: bytes) -> None: ...

    def close(self) -> None: ...


class MqttTransport:
    """A paho client with mutual TLS that keeps reconnecting (backoff 1 s doubling up to
    ``reconnect_max_seconds``) until closed.

    ``on_message(topic, payload)`` and ``on_state(connected)`` run on paho's network thread.
    ``latency_ms`` is an EWMA of PUBACK round trips (QoS 1), i.e. the measured link latency.

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
        self._client = c
        c.connect_async(host, port, keepalive=30)
        c.loop_start()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def _handle_connect(self, client: mqtt.Client, _u: Any, _flags: Any, reason_code: Any, _p: Any) -> None:
        if getattr(reason_code, "is_failure", False):
            return
        client.subscribe(self._subscribe, qos=1)
        with self.send_lock:
            self._drop_paho_queue(client)
            self._on_state(True)
            self._connected.set()

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
        try:
            self._client.disconnect()
        finally:
            self._client.loop_stop()
