"""Device side of enrollment and renewal, over the broker's HTTP API (stdlib ``urllib``).

``enroll`` generates the device key on the device (written 0600, never sent), sends a CSR with the
one-time token to ``POST /v1/edge/enroll`` and stores the returned certificate, CA and gateway
certificate. ``renew`` sends a new CSR for the same key, signed by the current key, to
``POST /v1/edge/renew`` and replaces the certificate.
"""

from __future__ import annotations

import base64
import json
import secrets
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from edge import pki
from edge.agent.config import AgentConfig

__all__ = ["enroll", "renew", "EnrollError", "default_device_id"]


class EnrollError(RuntimeError):
    """Enrollment or renewal failed; the message says why and what to do."""


def default_device_id() -> str:
    """``<hostname>-<6 hex>``, lower-cased and trimmed to the device id alphabet."""
    host = "".join(c if c.isalnum() else "-" for c in socket.gethostname().lower()).strip("-")[:40] or "dev"
    if host.startswith("hb-"):
        host = "d" + host
    return f"{host}-{secrets.token_hex(3)}"


def _post(url: str, data: dict[str, Any], ssl_context: ssl.SSLContext | None, timeout_s: float = 30) -> Any:
    req = urllib.request.Request(url, data=json.dumps(data).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=ssl_context) as resp:  # noqa: S310
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("detail", "")
        except ValueError:
            detail = ""
        raise EnrollError(f"broker refused ({exc.code}): {detail or exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EnrollError(f"cannot reach the broker at {url}: {exc}. To fix: check --broker") from None


def enroll(
    broker_url: str,
    token: str,
    state_dir: str | Path,
    *,
    device_id: str | None = None,
    mqtt: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    http_ca_file: str = "",
    labels: dict[str, str] | None = None,
) -> AgentConfig:
    """Enroll this device and write its state directory; returns the saved config.

    ``mqtt`` (``host:port``) overrides the MQTT address the broker announces; ``labels`` are the device's
    placement labels it asks for (the broker validates them; the enrollment token's override them)."""
    d = Path(state_dir)
    device_id = pki.validate_device_id(device_id or default_device_id())
    key_path = d / "device.key"
    if key_path.exists():
        key = pki.load_key(key_path)
    else:
        key = pki.generate_key()
        pki.write_private(key_path, pki.key_to_pem(key))
    csr = pki.make_csr(key, device_id).decode()
    resp = _post(f"{broker_url.rstrip('/')}/v1/edge/enroll", {"token": token, "csr_pem": csr, "labels": labels or {}},
                 ssl_context)
    (d / "device.pem").write_text(resp["cert_pem"])
    (d / "ca.pem").write_text(resp["ca_pem"])
    (d / "gateway.pem").write_text(resp["gateway_cert_pem"])
    host, port = "127.0.0.1", 8883
    announced = mqtt or resp.get("mqtt_url") or ""
    if announced:
        u = urllib.parse.urlsplit(announced if "://" in announced else f"mqtts://{announced}")
        host, port = u.hostname or host, u.port or port
    cfg = AgentConfig(state_dir=str(d), device_id=resp["device_id"], broker_url=broker_url,
                      mqtt_host=host, mqtt_port=port, http_ca_file=http_ca_file)
    cfg.save()
    if (d / "agent.db").exists():  # re-enrollment: the broker's record of this device starts afresh
        from edge.agent.store import Store

        st = Store(d / "agent.db")
        try:
            st.reset_wire_seqs()
        finally:
            st.close()
    return cfg


def renew(config: AgentConfig, *, ssl_context: ssl.SSLContext | None = None) -> None:
    """Get a fresh certificate for the same key, proving possession with the current one."""
    key = pki.load_key(config.path("device.key"))
    csr = pki.make_csr(key, config.device_id)
    sig = key.sign(csr, ec.ECDSA(hashes.SHA256()))
    resp = _post(
        f"{config.broker_url.rstrip('/')}/v1/edge/renew",
        {"cert_pem": config.path("device.pem").read_text(), "csr_pem": csr.decode(),
         "sig": base64.b64encode(sig).decode()},
        ssl_context,
    )
    tmp = config.path("device.pem.tmp")
    tmp.write_text(resp["cert_pem"])
    tmp.replace(config.path("device.pem"))
