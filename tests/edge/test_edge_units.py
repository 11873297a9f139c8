"""Unit tests of the edge pieces that need no MQTT: PKI, protocol, agent store, executor, offers, mqtt config."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

import edge
import edge.agent
from broker import devices
from broker.model import Capacity, SiteKind
from edge import mqttconf, pki, protocol
from edge.agent.executor import TaskHandle, run_task
from edge.agent.store import Store
from tests.edge.conftest import new_token

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def test_public_names_are_pinned() -> None:
    assert edge.__all__ == ["pki", "protocol", "mqttconf", "agent"]
    assert "Verifier" in protocol.__all__ and "CertificateAuthority" in pki.__all__
    assert set(edge.agent.__all__) >= {"store", "executor", "runtime", "cli"}


# ---- PKI -------------------------------------------------------------------------------------------
def test_ca_init_writes_private_keys_0600_and_refuses_to_overwrite(tmp_path: Path) -> None:
    ca = pki.CertificateAuthority.init(tmp_path / "ca")
    for name in ("ca.key", "gateway.key", "server.key"):
        assert (tmp_path / "ca" / name).stat().st_mode & 0o777 == 0o600
    server = pki.load_cert(tmp_path / "ca" / "server.pem")
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    with pytest.raises(pki.PkiError, match="already exists"):
        pki.CertificateAuthority.init(tmp_path / "ca")
    assert pki.CertificateAuthority.load(tmp_path / "ca").cert == ca.cert


def test_csr_is_signed_into_a_short_lived_client_cert_with_the_device_id_as_cn(ca: Any) -> None:
    key = pki.generate_key()
    cert = ca.sign_csr(pki.make_csr(key, "dev-1"), hours=72, now=NOW)
    assert pki.device_id_of(cert) == "dev-1"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.not_valid_after_utc - NOW == timedelta(hours=72)
    pki.verify_issued_by(cert, ca.cert, NOW)
    assert not pki.needs_renewal(cert, NOW) and pki.needs_renewal(cert, NOW + timedelta(hours=60))
    with pytest.raises(pki.PkiError, match="expired"):
        pki.verify_issued_by(cert, ca.cert, NOW + timedelta(hours=73))
    other = pki.CertificateAuthority(cert=ca.cert, key=pki.generate_key(), directory=ca.directory)
    forged = other.sign_csr(pki.make_csr(key, "dev-1"), now=NOW)
    with pytest.raises(pki.PkiError, match="not issued"):
        pki.verify_issued_by(forged, ca.cert, NOW)


@pytest.mark.parametrize("device_id", ["a", "Dev-1", "dev/1", "dev+", "dev#", "hb-gateway", "-dev", "x" * 64],
                         ids=["too short", "upper case", "slash", "plus", "hash", "reserved prefix",
                              "leading dash", "too long"])
def test_device_ids_that_could_break_topics_or_the_acl_are_refused(ca: Any, device_id: str) -> None:
    with pytest.raises(pki.PkiError, match="invalid"):
        ca.sign_csr(pki.make_csr(pki.generate_key(), device_id))


def test_crl_lists_revoked_serials(ca: Any) -> None:
    cert = ca.sign_csr(pki.make_csr(pki.generate_key(), "dev-crl"))
    crl = x509.load_pem_x509_crl(ca.crl([(pki.serial_hex(cert), NOW)], now=NOW))
    assert crl.get_revoked_certificate_by_serial_number(cert.serial_number) is not None
    assert crl.is_signature_valid(ca.cert.public_key())


def test_tokens_are_random_and_stored_as_hashes() -> None:
    a, b = pki.new_token(), pki.new_token()
    assert a != b and len(pki.hash_token(a)) == 64 and pki.hash_token(a) != a


# ---- protocol --------------------------------------------------------------------------------------
def test_seal_then_check_round_trips_and_canonical_encoding_is_sorted_compact_utf8() -> None:
    key = pki.generate_key()
    raw = protocol.seal("result", {"b": 1, "a": "é"}, device="d1", seq=7, key=key, id="m1", ts=protocol.now_ms())
    env = protocol.open_envelope(raw)
    assert raw == protocol.canonical({**env.unsigned(), "sig": env.sig})
    assert "é".encode() in raw and b" " not in raw
    v = protocol.Verifier()
    v.check(env, device="d1", public_key=key.public_key())
    v.accept(env)
    assert v.last_seq["d1"] == 7


CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("a signature by another key", protocol.SIGNATURE, {"key": "other"}),
    ("a body changed after signing", protocol.SIGNATURE, {"tamper": True}),
    ("another device's name in the envelope", protocol.IDENTITY, {"device": "d2"}),
    ("a timestamp ten minutes old", protocol.STALE, {"ts_offset": -600_000}),
    ("a timestamp ten minutes ahead", protocol.STALE, {"ts_offset": 600_000}),
    ("an id already seen", protocol.DUPLICATE, {"id": "seen"}),
    ("a sequence number not above the last", protocol.REPLAY, {"seq": 5}),
]


@pytest.mark.parametrize("reason, change", [(r, c) for _n, r, c in CASES],
                         ids=[f"{n} is refused as {r}" for n, r, _c in CASES])
def test_verifier_refuses(reason: str, change: dict[str, Any]) -> None:
    key = pki.generate_key()
    v = protocol.Verifier()
    first = protocol.open_envelope(protocol.seal("x", {}, device="d1", seq=5, key=key, id="seen"))
    v.accept(first)
    signer = pki.generate_key() if change.get("key") == "other" else key
    raw = protocol.seal("x", {"n": 1}, device=change.get("device", "d1"), seq=change.get("seq", 6), key=signer,
                        id=change.get("id", "new"), ts=protocol.now_ms() + change.get("ts_offset", 0))
    if change.get("tamper"):
        raw = raw.replace(b'"n":1', b'"n":2')
    counter = protocol.RejectionCounter()
    with pytest.raises(protocol.Rejected) as err:
        v.check(protocol.open_envelope(raw), device="d1", public_key=key.public_key())
    counter.add(err.value.reason)
    assert err.value.reason == reason and counter.counts == {reason: 1}


@pytest.mark.parametrize("payload, reason", [
    (b"x" * (protocol.MAX_PAYLOAD_BYTES + 1), protocol.OVERSIZE), (b"\xff\xfe", protocol.MALFORMED),
    (b"[1]", protocol.MALFORMED), (b'{"v": 2}', protocol.VERSION_MISMATCH),
    (json.dumps({"v": 1, "id": "a", "device": "d", "seq": True, "ts": 1, "kind": "k", "body": {},
                 "sig": ""}).encode(), protocol.MALFORMED),
    (json.dumps({"v": 1, "id": "a", "device": "d", "seq": 1, "ts": 1, "kind": "k", "body": {}, "sig": "",
                 "extra": 1}).encode(), protocol.MALFORMED),
], ids=["oversize", "not utf-8", "not an object", "wrong version", "boolean seq", "unknown field"])
def test_open_envelope_refuses_bad_shapes(payload: bytes, reason: str) -> None:
    with pytest.raises(protocol.Rejected) as err:
        protocol.open_envelope(payload)
    assert err.value.reason == reason


def test_topics_parse_and_refuse_foreign_roots() -> None:
    assert protocol.parse_topic(protocol.up_topic("d1", "result")) == ("d1", "up", "result")
    with pytest.raises(protocol.Rejected):
        protocol.parse_topic("other/v1/dev/d1/up/result")


# ---- agent store -----------------------------------------------------------------------------------
def test_outbox_keeps_order_dedupes_ids_and_caps_telemetry_oldest_first(tmp_path: Path) -> None:
    st = Store(tmp_path / "a.db", telemetry_cap=3)
    st.put_many([("result", {"i": i}, f"r{i}", False) for i in range(5)])
    st.put_many([("telemetry", {"t": i}, f"t{i}", True) for i in range(6)])
    st.put("result", {"i": 0, "again": True}, id="r0")  # same id: kept once, first body wins
    rows = st.pending(0, 100)
    assert [r.id for r in rows] == ["r0", "r1", "r2", "r3", "r4", "t3", "t4", "t5"]
    assert rows[0].body == {"i": 0}
    assert st.depth() == {"outbox": 8, "telemetry": 3, "results": 5}
    st.close()
    again = Store(tmp_path / "a.db", telemetry_cap=3)  # survives a restart
    wired = again.assign_wire_seqs(again.pending(0, 3))
    assert [r.wire_seq for r in wired] == [0, 1, 2]
    assert again.ack(["r0", "r1", "nope"]) == 2
    assert [r.wire_seq for r in again.assign_wire_seqs(again.pending(0, 100))] == [2, 3, 4, 5, 6, 7]
    again.close()


def test_inbox_applies_a_task_id_once(tmp_path: Path) -> None:
    st = Store(tmp_path / "a.db")
    assert st.add_task("t1", "j1", {"command": ["true"]}, None)
    assert not st.add_task("t1", "j1", {"command": ["false"]}, None)
    st.set_task_state("t1", "succeeded", exit_code=0)
    t = st.task("t1")
    assert t is not None and t.state == "succeeded" and t.exit_code == 0 and t.spec == {"command": ["true"]}
    st.close()


# ---- executor --------------------------------------------------------------------------------------
def _run(tmp_path: Path, code: str, **extra: Any) -> tuple[str, int | None, list[tuple[str, Any, str, bool]]]:
    emitted: list[tuple[str, Any, str, bool]] = []
    body = {"task_id": "t1", "job_id": "j1", "command": [sys.executable, "-c", code], **extra}
    state, rc = run_task(body, workdir_root=tmp_path, attempt=1, emit=emitted.extend, handle=TaskHandle())
    return state, rc, emitted


def test_executor_streams_results_and_runs_in_its_own_workdir(tmp_path: Path) -> None:
    code = "import os\nprint('@hb-result {\"cwd\": \"%s\"}' % os.getcwd())\nprint('plain')\n"
    state, rc, out = _run(tmp_path, code, env={"X": "1"})
    assert (state, rc) == ("succeeded", 0)
    kinds = [(k, i) for k, _b, i, _d in out]
    assert kinds == [("status", "t1/run1"), ("result", "t1/r0"), ("result", "t1/final")]
    assert out[1][1]["value"] == {"cwd": str(tmp_path / "t1")}
    assert "plain" in out[2][1]["stdout_tail"]


@pytest.mark.parametrize("code, extra, needle", [
    ("import time; time.sleep(30)", {"timeout_seconds": 0.5}, "time limit"),
    ("x = bytearray(400 * 1024 * 1024)", {"memory_mib": 128}, "MemoryError"),
    ("raise SystemExit(3)", {}, ""),
], ids=["a task over its time limit is killed", "a task over its memory limit fails",
        "a non-zero exit fails the task"])
def test_executor_limits(tmp_path: Path, code: str, extra: dict[str, Any], needle: str) -> None:
    state, rc, out = _run(tmp_path, code, **extra)
    final = out[-1][1]
    assert state == "failed" and rc != 0 and final["final"]
    assert needle in (final.get("error", "") + final["stderr_tail"])


# ---- devices as capacity -------------------------------------------------------------------------
def _device(store: Any, ca: Any, device_id: str, *, seen_s_ago: float | None, vcpus: float = 4,
            revoked: bool = False) -> None:
    now = datetime.now(UTC)
    with store.tx() as s:
        devices.enroll_device(s, ca, new_token(store), pki.make_csr(pki.generate_key(), device_id).decode(), now=now)
    with store.tx() as s:
        dev = devices.get_device(s, device_id)
        dev.vcpus, dev.memory_gib, dev.arch, dev.bandwidth_mbps, dev.latency_ms = vcpus, 8, "arm64", 50.0, 12.0
        dev.last_seen = None if seen_s_ago is None else now - timedelta(seconds=seen_s_ago)
        s.add(dev)
    if revoked:
        with store.tx() as s:
            devices.revoke_device(s, None, device_id, now=now)


def test_device_offers_are_owned_edge_capacity_and_offline_aware(store: Any, fresh_ca: Any) -> None:
    _device(store, fresh_ca, "online-dev", seen_s_ago=5)
    _device(store, fresh_ca, "blip-dev", seen_s_ago=200)
    _device(store, fresh_ca, "gone-dev", seen_s_ago=86_400)
    _device(store, fresh_ca, "never-dev", seen_s_ago=None)
    _device(store, fresh_ca, "no-capacity-dev", seen_s_ago=5, vcpus=0)
    _device(store, fresh_ca, "revoked-dev", seen_s_ago=5, revoked=True)
    now = datetime.now(UTC)
    with store.read() as s:
        strict = devices.device_offers(s, now)
        patient = devices.device_offers(s, now, max_offline_s=600)
    assert [o.region for o in strict] == ["online-dev"]
    assert [o.region for o in patient] == ["blip-dev", "online-dev"]
    o = strict[0]
    assert (o.provider, o.location.site, o.capacity) == ("edge", SiteKind.EDGE, Capacity.OWNED)
    assert (o.instance_type.vcpus, o.instance_type.arch, o.instance_type.network_gbps) == (4, "arm64", 0.05)


def test_device_sites_carry_the_measured_link(store: Any, fresh_ca: Any) -> None:
    pytest.importorskip("pricing.inventory")
    _device(store, fresh_ca, "site-dev", seen_s_ago=1)
    with store.read() as s:
        (site,) = devices.device_sites(s, datetime.now(UTC))
    assert (site.name, site.provider, site.uplink_gbps, site.latency_ms) == ("site-dev", "edge", 0.05, 12.0)
    assert site.location.key == "edge:site-dev"


def test_the_dynsec_state_denies_by_default_and_pins_each_device_to_its_own_subtree(tmp_path: Path) -> None:
    doc = mqttconf.dynsec_document("hb-gateway")
    assert doc["defaultACLAccess"] == {"publishClientSend": False, "publishClientReceive": False,
                                       "subscribe": False, "unsubscribe": True}
    assert doc["clients"][0]["username"] == "hb-gateway" and [r["rolename"] for r in doc["roles"]] == ["hb-gateway"]
    assert {(a["acltype"], a["topic"]) for a in mqttconf.device_role("cam-7")["acls"]} == {
        ("publishClientSend", "hb/v1/dev/cam-7/up/#"), ("subscribePattern", "hb/v1/dev/cam-7/down/#"),
        ("publishClientReceive", "hb/v1/dev/cam-7/down/#")}
    assert [c["command"] for c in mqttconf.device_grant_commands("cam-7")] == ["createRole", "createClient"]
    assert [c["command"] for c in mqttconf.device_revoke_commands("cam-7")] == ["deleteClient", "deleteRole"]
    with pytest.raises(FileNotFoundError, match="dynsec-plugin"):
        mqttconf.find_dynsec_plugin([str(tmp_path / "nope.so")])
