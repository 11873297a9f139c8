"""The edge HTTP API (real uvicorn), the `broker` edge commands and the `edge-agent` CLI."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from broker import devices
from broker.clock import utcnow
from broker.tenants import create_namespace
from edge import pki
from edge.agent.config import AgentConfig
from edge.agent.enroll import EnrollError, enroll, renew
from tests.edge.conftest import REPO, new_token

ADMIN = {"Authorization": "Bearer admin-token"}


def test_enroll_renew_list_revoke_and_crl(tmp_path: Path, edge_api: Any, store: Any, fresh_ca: Any) -> None:
    cfg = enroll(edge_api.url, new_token(store), tmp_path / "dev", device_id="api-dev-1", mqtt="127.0.0.1:18883")
    assert (cfg.device_id, cfg.mqtt_host, cfg.mqtt_port) == ("api-dev-1", "127.0.0.1", 18883)
    cert = pki.load_cert(cfg.path("device.pem"))
    key = pki.load_key(cfg.path("device.key"))
    assert cert.public_key() == key.public_key() and pki.device_id_of(cert) == "api-dev-1"
    renew(cfg)
    renewed = pki.load_cert(cfg.path("device.pem"))
    assert renewed.serial_number != cert.serial_number and renewed.public_key() == key.public_key()
    with httpx.Client(base_url=edge_api.url) as c:
        assert c.get("/v1/devices").status_code == 403
        listed = c.get("/v1/devices", headers=ADMIN).json()["devices"]
        assert [(d["id"], d["namespace"], d["status"]) for d in listed] == [("api-dev-1", "team-a", "offline")]
        r = c.post("/v1/devices/api-dev-1:revoke", headers=ADMIN)
        assert r.status_code == 200 and r.json()["status"] == "revoked"
        assert c.post("/v1/devices/nope:revoke", headers=ADMIN).status_code == 404
        crl = x509.load_pem_x509_crl(c.get("/v1/edge/crl").content)
        for serial in (cert.serial_number, renewed.serial_number):  # superseded certs are revoked too
            assert crl.get_revoked_certificate_by_serial_number(serial) is not None
        on_disk = x509.load_pem_x509_crl((fresh_ca.directory / "crl.pem").read_bytes())
        assert on_disk.get_revoked_certificate_by_serial_number(renewed.serial_number) is not None
        assert len(c.get("/v1/edge/probe", params={"bytes": 1000}).content) == 1000
        tok = c.post("/v1/edge/enroll-tokens", json={"namespace": "team-b", "ttl_seconds": 60}, headers=ADMIN)
        assert tok.status_code == 404 and "broker namespaces create" in tok.json()["detail"]  # no such namespace
        with store.tx() as session:
            create_namespace(session, "team-b", now=utcnow())
        tok = c.post("/v1/edge/enroll-tokens", json={"namespace": "team-b", "ttl_seconds": 60}, headers=ADMIN)
        assert tok.status_code == 201 and tok.json()["token"].startswith("hbe_")
    with pytest.raises(EnrollError, match="400"):
        renew(cfg)  # a revoked device cannot renew


def _csr(device_id: str) -> str:
    return pki.make_csr(pki.generate_key(), device_id).decode()


@pytest.mark.parametrize("case, status", [
    ("token used twice", 400), ("unknown token", 400), ("expired token", 400), ("garbage csr", 400),
    ("device id taken", 409), ("reserved device id", 400), ("missing fields", 422),
], ids=lambda v: str(v))
def test_bad_enrollments_get_a_4xx_with_a_message(edge_api: Any, store: Any, case: str, status: int) -> None:
    url = f"{edge_api.url}/v1/edge/enroll"
    if case in ("token used twice", "device id taken"):
        assert httpx.post(url, json={"token": new_token(store), "csr_pem": _csr("twice-dev")}).status_code == 200
    token = {"unknown token": "hbe_" + "x" * 40, "expired token": new_token(store, ttl_s=1e-6)}.get(
        case, new_token(store))
    if case == "token used twice":
        token = new_token(store)
        httpx.post(url, json={"token": token, "csr_pem": _csr("first-dev")})
    csr = {"garbage csr": "-----BEGIN CERTIFICATE REQUEST-----\n" + "A" * 80 + "\n-----END CERTIFICATE REQUEST-----",
           "device id taken": _csr("twice-dev"), "reserved device id": _csr("hb-gateway")}.get(case, _csr("new-dev"))
    body: dict[str, Any] = {} if case == "missing fields" else {"token": token, "csr_pem": csr}
    r = httpx.post(url, json=body)
    assert r.status_code == status, r.text
    assert r.json()["detail"]


def test_renewal_needs_proof_of_possession(tmp_path: Path, edge_api: Any, store: Any) -> None:
    cfg = enroll(edge_api.url, new_token(store), tmp_path / "dev", device_id="pop-dev")
    thief_key = pki.generate_key()
    csr = pki.make_csr(thief_key, "pop-dev")
    sig = base64.b64encode(thief_key.sign(csr, ec.ECDSA(hashes.SHA256()))).decode()
    r = httpx.post(f"{edge_api.url}/v1/edge/renew",
                   json={"cert_pem": cfg.path("device.pem").read_text(), "csr_pem": csr.decode(), "sig": sig})
    assert r.status_code == 400 and "possession" in r.json()["detail"]


class _Run:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _broker(args: list[str], capsys: pytest.CaptureFixture[str]) -> _Run:
    """Run `broker ARGS` in-process through the real entry point (error handling included)."""
    from broker.cli import main

    code = 0
    try:
        main(args)
    except SystemExit as exc:
        code = int(exc.code or 0) if not isinstance(exc.code, str) else 1
    out = capsys.readouterr()
    return _Run(code, out.out, out.err)


def test_broker_edge_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BROKER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("BROKER_DATABASE_URL", raising=False)
    monkeypatch.delenv("BROKER_CA_KEY_FILE", raising=False)
    env = capsys
    r = _broker(["ca", "init", "--local"], env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "data/ca/ca.key").stat().st_mode & 0o777 == 0o600
    again = _broker(["ca", "init", "--local"], env)
    assert again.returncode != 0 and again.stderr.count("\n") == 1 and "--force" in again.stderr
    tok = _broker(["devices", "enroll-token", "--namespace", "team-a", "--local"], env)
    assert tok.returncode != 0 and tok.stderr.count("\n") == 1 and "broker namespaces create" in tok.stderr
    tok = _broker(["devices", "enroll-token", "--namespace", "default", "--local"], env)  # exists from the start
    assert tok.returncode == 0 and tok.stdout.strip().startswith("hbe_"), tok.stderr
    listed = _broker(["devices", "list", "--json", "--local"], env)
    assert json.loads(listed.stdout) == {"devices": []}
    bad = _broker(["devices", "revoke", "ghost", "--local"], env)
    assert bad.returncode != 0 and "not found" in bad.stderr and "Traceback" not in bad.stderr
    out = tmp_path / "mq"
    r = _broker(["mqtt", "config", "--out", str(out), "--port", "18883"], env)
    assert r.returncode == 0, r.stderr
    conf = (out / "mosquitto.conf").read_text()
    for line in ("require_certificate true", "use_identity_as_username true", "persistence true",
                 f"crlfile {out.resolve() / 'certs/crl.pem'}", "listener 18883 0.0.0.0", "allow_anonymous false"):
        assert line in conf
    assert "acl_file" not in conf and f"plugin_opt_config_file {out.resolve() / 'persist/dynsec.json'}" in conf
    state = json.loads((out / "persist" / "dynsec.json").read_text())
    assert [c["username"] for c in state["clients"]] == ["hb-gateway"]
    nope = _broker(["mqtt", "config", "--out", str(tmp_path / "mq2"), "--dynsec-plugin", str(tmp_path / "x.so")], env)
    assert nope.returncode != 0 and "--dynsec-plugin" in nope.stderr and nope.stderr.count("\n") == 1


def test_broker_edge_commands_go_through_the_api_of_a_running_broker(
        tmp_path: Path, edge_api: Any, store: Any, fresh_ca: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BROKER_DATA_DIR", str(tmp_path / "local-data"))  # must stay untouched
    monkeypatch.setenv("BROKER_URL", edge_api.url)
    monkeypatch.setenv("BROKER_TOKEN", "admin-token")
    exists = _broker(["ca", "init"], capsys)
    assert exists.returncode == 1 and exists.stderr.count("\n") == 1 and "(HTTP 409)" in exists.stderr
    r = _broker(["ca", "init", "--force", "--host", "mqtt.example"], capsys)
    assert r.returncode == 0 and str(fresh_ca.directory) in r.stdout, r.stderr
    server = x509.load_pem_x509_certificate((fresh_ca.directory / "server.pem").read_bytes())
    assert "mqtt.example" in server.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    tok = _broker(["devices", "enroll-token", "--namespace", "team-a", "--ttl", "60"], capsys)
    assert tok.returncode == 1 and "(HTTP 404)" in tok.stderr and "broker namespaces create" in tok.stderr
    with store.tx() as s:
        create_namespace(s, "team-a", now=utcnow())
    tok = _broker(["devices", "enroll-token", "--namespace", "team-a", "--ttl", "60"], capsys)
    assert tok.returncode == 0 and tok.stdout.strip().startswith("hbe_")
    cfg = enroll(edge_api.url, tok.stdout.strip(), tmp_path / "dev", device_id="remote-dev")  # the server's token
    listed = _broker(["devices", "list", "--json", "-n", "team-a"], capsys)
    assert [d["id"] for d in json.loads(listed.stdout)["devices"]] == [cfg.device_id]
    r = _broker(["devices", "revoke", "remote-dev"], capsys)
    assert r.returncode == 0 and "revoked remote-dev" in r.stdout
    with store.read() as s:
        assert devices.get_device(s, "remote-dev").revoked_at is not None
    assert not (tmp_path / "local-data").exists()
    monkeypatch.setenv("BROKER_TOKEN", "not-the-admin")
    denied = _broker(["devices", "enroll-token", "--namespace", "team-a"], capsys)
    assert denied.returncode == 1 and denied.stderr.count("\n") == 1 and "403" in denied.stderr
    assert _broker(["ca", "init", "--dir", "x"], capsys).returncode == 2
    monkeypatch.setenv("BROKER_URL", "http://127.0.0.1:1")
    down = _broker(["devices", "list"], capsys)
    assert down.returncode == 1 and "cannot reach the broker" in down.stderr and "Traceback" not in down.stderr


def _agent(args: list[str], state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge.agent.cli", "--state-dir", str(state), *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_edge_agent_cli_install_status_and_errors(tmp_path: Path, edge_api: Any, store: Any) -> None:
    r = _agent(["install", "--root", str(tmp_path / "root"), "--dry-run"], tmp_path / "s")
    assert r.returncode == 0 and "ExecStart=" in r.stdout and not (tmp_path / "root").exists()
    r = _agent(["install", "--root", str(tmp_path / "root")], tmp_path / "s")
    unit = (tmp_path / "root/etc/systemd/system/hb-edge-agent.service").read_text()
    assert r.returncode == 0 and "Restart=always" in unit and "HB_EDGE_HOME=/var/lib/hb-edge" in unit
    # tasks get their own directory beside the state directory, never inside it
    assert (tmp_path / "root/var/lib/hb-edge").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "root/var/lib/hb-edge-tasks").stat().st_mode & 0o777 == 0o711
    r = _agent(["run"], tmp_path / "not-enrolled")
    assert r.returncode == 2 and "edge-agent enroll" in r.stderr and "Traceback" not in r.stderr
    r = _agent(["enroll", "--broker", edge_api.url, "--token", "hbe_wrong-token-123"], tmp_path / "s")
    assert r.returncode != 0 and "refused (400)" in r.stderr and "Traceback" not in r.stderr
    r = _agent(["enroll", "--broker", edge_api.url, "--token", new_token(store), "--device-id", "cli-dev"],
               tmp_path / "s")
    assert r.returncode == 0, r.stderr
    assert AgentConfig.load(tmp_path / "s").device_id == "cli-dev"
    r = _agent(["status"], tmp_path / "s")
    assert r.returncode == 0 and "cli-dev" in r.stdout and "agent not running" in r.stdout
