"""Refused, with nothing else affected (real Mosquitto, mutual TLS, the generated config and ACL)."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from broker import devices
from broker.clock import utcnow
from edge import pki, protocol
from tests.edge.conftest import MOSQUITTO, Mosquitto, make_gateway, new_token, wait_until

pytestmark = pytest.mark.network


class Device:
    """A raw MQTT client holding an enrolled device's key and certificate (v5, to see PUBACK codes)."""

    def __init__(self, fleet: Fleet, device_id: str, cert: Path, key: Path) -> None:
        self.id = device_id
        self.fleet = fleet
        self.key = pki.load_key(key)
        self.seq = 0
        self.connect_result: list[Any] = []
        self.puback: dict[int, Any] = {}
        self.connected = threading.Event()
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device_id, protocol=MQTTProtocolVersion.MQTTv5)
        c.tls_set(ca_certs=str(fleet.ca.directory / "ca.pem"), certfile=str(cert), keyfile=str(key),
                  tls_version=ssl.PROTOCOL_TLS_CLIENT)
        c.on_connect = self._on_connect
        c.on_publish = lambda _c, _u, mid, rc, _p: self.puback.__setitem__(mid, rc)
        self.client = c

    def _on_connect(self, _c: Any, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        self.connect_result.append(rc)
        if not rc.is_failure:
            self.connected.set()

    def connect(self, timeout: float = 3.0) -> bool:
        try:
            self.client.connect("127.0.0.1", self.fleet.mosq.port)
        except (ssl.SSLError, OSError):
            return False
        self.client.loop_start()
        return self.connected.wait(timeout)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def seal(self, body: dict[str, Any] | None = None, *, kind: str = "telemetry", **kw: Any) -> bytes:
        seq = kw.pop("seq", self.seq)
        self.seq = max(self.seq, seq + 1)
        return protocol.seal(kind, body or {"x": 1}, device=kw.pop("device", self.id), seq=seq,
                             key=kw.pop("key", self.key), **kw)

    def publish(self, payload: bytes, *, topic_device: str | None = None, kind: str = "telemetry") -> Any:
        info = self.client.publish(protocol.up_topic(topic_device or self.id, kind), payload, qos=1)
        info.wait_for_publish(5)
        wait_until(lambda: info.mid in self.puback, 5, "PUBACK")
        return self.puback[info.mid]


class Fleet:
    def __init__(self, root: Path) -> None:
        self.ca = pki.CertificateAuthority.init(root / "ca")
        self.mosq = Mosquitto(root / "mqtt", self.ca.directory)
        from broker.migrations import upgrade
        from broker.store import Store

        self.store = Store(f"sqlite:///{root / 'broker.db'}")
        upgrade(self.store.engine)
        self.root = root
        self.gw: Any = None

    def enroll(self, device_id: str, *, hours: float = 24, now: Any = None) -> tuple[Path, Path]:
        key = pki.generate_key()
        kp = self.root / f"{device_id}.key"
        pki.write_private(kp, pki.key_to_pem(key))
        with self.store.tx() as s:
            _dev, pem = devices.enroll_device(s, self.ca, new_token(self.store), pki.make_csr(key, device_id).decode(),
                                              now=now or utcnow(), cert_hours=hours)
        cp = self.root / f"{device_id}.pem"
        cp.write_text(pem)
        if self.gw is not None:  # let it in now (the gateway's own sync would within acl_sync_s)
            self.gw.sync_acl()
        return cp, kp

    def device(self, device_id: str, **kw: Any) -> Device:
        cp, kp = self.enroll(device_id, **kw)
        return Device(self, device_id, cp, kp)

    def stored(self, device_id: str) -> int:
        with self.store.read() as s:
            return len(devices.uplink_bodies(s, device_id))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install -y mosquitto)")
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    f.mosq.start()
    f.gw = make_gateway(f.store, f.mosq, f.ca, max_payload_bytes=64 * 1024)
    good = f.device("good-dev")
    assert good.connect()
    f.good = good  # type: ignore[attr-defined]
    try:
        yield f
    finally:
        good.close()
        f.gw.stop()
        f.mosq.stop()
        f.store.dispose()


def _good_still_works(fleet: Fleet) -> None:
    good: Device = fleet.good  # type: ignore[attr-defined]
    before = fleet.stored("good-dev")
    assert not good.publish(good.seal({"alive": True})).is_failure
    wait_until(lambda: fleet.stored("good-dev") == before + 1, 10, "the good device's message to be stored")


def _rejected(fleet: Fleet, reason: str, before: int) -> None:
    wait_until(lambda: fleet.gw.rejections.counts.get(reason, 0) > before, 10, f"a {reason!r} rejection")


def test_a_client_without_a_certificate_is_refused(fleet: Fleet) -> None:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="anon", protocol=MQTTProtocolVersion.MQTTv5)
    c.tls_set(ca_certs=str(fleet.ca.directory / "ca.pem"), tls_version=ssl.PROTOCOL_TLS_CLIENT)
    ok = threading.Event()
    c.on_connect = lambda *_a: ok.set()
    try:
        c.connect("127.0.0.1", fleet.mosq.port)
        c.loop_start()
        assert not ok.wait(2.0)
    except (ssl.SSLError, OSError):
        pass  # refused during the handshake
    finally:
        c.loop_stop()
    _good_still_works(fleet)


def test_a_revoked_certificate_is_refused_by_mosquitto_and_the_gateway(fleet: Fleet) -> None:
    dev = fleet.device("revoked-dev")
    assert dev.connect()
    with fleet.store.tx() as s:
        devices.revoke_device(s, fleet.ca, "revoked-dev", now=utcnow())
    before = fleet.gw.rejections.counts.get(protocol.REVOKED, 0)
    dev.publish(dev.seal())  # still connected: the gateway refuses it at once
    _rejected(fleet, protocol.REVOKED, before)
    dev.close()
    fleet.mosq.reload_crl()
    again = Device(fleet, "revoked-dev", fleet.root / "revoked-dev.pem", fleet.root / "revoked-dev.key")
    assert not again.connect(2.0)  # Mosquitto checks the CRL at the handshake
    again.client.loop_stop()
    assert fleet.stored("revoked-dev") == 0
    _good_still_works(fleet)


def test_an_expired_certificate_is_refused(fleet: Fleet) -> None:
    dev = fleet.device("expired-dev", hours=1, now=utcnow() - timedelta(days=2))
    assert not dev.connect(2.0)
    dev.client.loop_stop()
    _good_still_works(fleet)


def test_publishing_on_another_devices_topic_is_not_authorized(fleet: Fleet) -> None:
    dev = fleet.device("nosy-dev")
    assert dev.connect()
    try:
        rc = dev.publish(dev.seal(device="good-dev"), topic_device="good-dev")
        assert rc.is_failure and "authorized" in str(rc).lower()
        time.sleep(0.3)
        assert fleet.stored("nosy-dev") == 0
    finally:
        dev.close()
    _good_still_works(fleet)


BAD = [
    ("forged signature", protocol.SIGNATURE, lambda d: d.seal(key=pki.generate_key())),
    ("stale timestamp", protocol.STALE, lambda d: d.seal(ts=protocol.now_ms() - 3_600_000)),
    ("malformed payload", protocol.MALFORMED, lambda d: b"{not json"),
    ("envelope missing fields", protocol.MALFORMED, lambda d: json.dumps({"v": 1, "id": "x"}).encode()),
    ("oversize payload", protocol.OVERSIZE, lambda d: d.seal({"blob": "x" * 100_000})),
    ("envelope naming another device", protocol.IDENTITY, lambda d: d.seal(device="good-dev")),
    ("unknown protocol version", protocol.VERSION_MISMATCH, lambda d: json.dumps({"v": 99}).encode()),
]


@pytest.mark.parametrize("make, reason", [(m, r) for _n, r, m in BAD],
                         ids=[f"{n} is refused as {r!r} and others are unaffected" for n, r, _m in BAD])
def test_bad_payloads_are_refused_by_reason(fleet: Fleet, make: Any, reason: str) -> None:
    dev_id = f"bad-{reason.replace('_', '-')}-{len(fleet.gw.rejections.counts)}"
    dev = fleet.device(dev_id)
    assert dev.connect()
    try:
        before = fleet.gw.rejections.counts.get(reason, 0)
        dev.publish(make(dev))
        _rejected(fleet, reason, before)
        # the same device's next good message is still accepted (one bad message disturbs nothing)
        dev.publish(dev.seal(seq=0))
        wait_until(lambda: fleet.stored(dev_id) == 1, 10, "the device's good message")
    finally:
        dev.close()
    _good_still_works(fleet)


def test_a_replayed_message_is_dropped_once_stored(fleet: Fleet) -> None:
    dev = fleet.device("replay-dev")
    assert dev.connect()
    try:
        msg = dev.seal(seq=0)
        dev.publish(msg)
        wait_until(lambda: fleet.stored("replay-dev") == 1, 10, "the first copy")
        dup = fleet.gw.rejections.counts.get(protocol.DUPLICATE, 0)
        dev.publish(msg)  # the very same bytes again
        _rejected(fleet, protocol.DUPLICATE, dup)
        replay = fleet.gw.rejections.counts.get(protocol.REPLAY, 0)
        dev.publish(dev.seal(seq=0))  # a new id with an old sequence number
        _rejected(fleet, protocol.REPLAY, replay)
        assert fleet.stored("replay-dev") == 1
    finally:
        dev.close()
    _good_still_works(fleet)
