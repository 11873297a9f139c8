"""Edge devices in the store: enrollment tokens, devices, revocations, uplink messages, dispatched tasks;
the registry functions the API, CLI and gateway use; and devices as placement capacity.

Contracts:

* Enrollment tokens are one-time and expiring; only their SHA-256 is stored (:func:`create_enroll_token`,
  :func:`enroll_device`).
* A device id is the CN of its certificate. Revoking a device records the serial of each certificate it
  was issued (current and superseded), rewrites the CA's ``crl.pem`` and makes the gateway drop its
  messages (:func:`revoke_device`).
* ``edge_uplinks`` has one row per (device, message id): the gateway inserts idempotently.
* :func:`device_offers` turns online (or recently seen) devices into :class:`~broker.model.Offer` s with
  ``Location(provider="edge", region=<device id>, site=EDGE)`` and ``Capacity.OWNED``; :func:`device_sites`
  gives their :class:`pricing.inventory.Site` (uplink from the measured bandwidth) for the egress model.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from sqlmodel import Field, Session, SQLModel, col, select

from broker.errors import ConflictError, NotFoundError, SpecError
from broker.model import Capacity, InstanceType, Location, Offer, SiteKind
from broker.spec import validate_labels
from broker.store import utc, utc_column
from edge import pki

__all__ = [
    "EdgeDeviceRow",
    "EnrollTokenRow",
    "RevocationRow",
    "UplinkRow",
    "EdgeTaskRow",
    "EDGE_TABLES",
    "OFFLINE_AFTER_SECONDS",
    "create_enroll_token",
    "enroll_device",
    "renew_device",
    "revoke_device",
    "revoked_serials",
    "write_crl",
    "get_device",
    "label_device",
    "device_labels",
    "list_devices",
    "device_view",
    "is_online",
    "device_offers",
    "device_sites",
    "uplink_bodies",
    "CertIssuedRow",
]

OFFLINE_AFTER_SECONDS = 90.0  # no message for this long = offline (heartbeats come every 30 s)


_ts = functools.partial(utc_column, nullable=True)  # device timestamps are optional unless said otherwise


class EdgeDeviceRow(SQLModel, table=True):
    """One enrolled device and what it last reported."""

    __tablename__ = "edge_devices"
    id: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    namespace: str = Field(sa_column=sa.Column(sa.String(128), nullable=False, index=True))
    cert_pem: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    cert_serial: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    cert_not_after: datetime = _ts(nullable=False)
    enrolled_at: datetime = _ts(nullable=False)
    revoked_at: datetime | None = _ts()
    last_seen: datetime | None = _ts(index=True)
    online: bool = Field(default=False, sa_column=sa.Column(sa.Boolean, nullable=False, default=False))
    last_seq: int = Field(default=-1, sa_column=sa.Column(sa.BigInteger, nullable=False, default=-1))
    vcpus: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False, default=0.0))
    memory_gib: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False, default=0.0))
    gpus: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, default=0))
    accelerator: str | None = Field(default=None, sa_column=sa.Column(sa.String(64), nullable=True))
    arch: str = Field(default="amd64", sa_column=sa.Column(sa.String(16), nullable=False, default="amd64"))
    disk_gib: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False, default=0.0))
    bandwidth_mbps: float | None = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    latency_ms: float | None = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    agent_version: str | None = Field(default=None, sa_column=sa.Column(sa.String(32), nullable=True))
    continent: str = Field(default="", sa_column=sa.Column(sa.String(8), nullable=False, default=""))
    hourly_usd: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False, default=0.0))
    labels: str = Field(default="{}", sa_column=sa.Column(sa.Text, nullable=False, server_default="{}"))


class EnrollTokenRow(SQLModel, table=True):
    """A one-time enrollment token, by hash."""

    __tablename__ = "edge_enroll_tokens"
    token_sha256: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    namespace: str = Field(sa_column=sa.Column(sa.String(128), nullable=False))
    created_at: datetime = _ts(nullable=False)
    expires_at: datetime = _ts(nullable=False)
    used_at: datetime | None = _ts()
    device_id: str | None = Field(default=None, sa_column=sa.Column(sa.String(64), nullable=True))
    labels: str = Field(default="{}", sa_column=sa.Column(sa.Text, nullable=False, server_default="{}"))


class RevocationRow(SQLModel, table=True):
    """A revoked certificate serial (hex), listed in the CRL."""

    __tablename__ = "edge_revocations"
    serial: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    device_id: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, index=True))
    revoked_at: datetime = _ts(nullable=False)
    reason: str = Field(default="", sa_column=sa.Column(sa.String(256), nullable=False, default=""))


class CertIssuedRow(SQLModel, table=True):
    """Every certificate issued to a device (so revocation can list superseded ones too)."""

    __tablename__ = "edge_certs"
    serial: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    device_id: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, index=True))
    not_after: datetime = _ts(nullable=False)


class UplinkRow(SQLModel, table=True):
    """One accepted uplink message (idempotent by ``(device_id, msg_id)``)."""

    __tablename__ = "edge_uplinks"
    device_id: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    msg_id: str = Field(sa_column=sa.Column(sa.String(128), primary_key=True))
    seq: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    kind: str = Field(sa_column=sa.Column(sa.String(32), nullable=False))
    ts_ms: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    body: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    received_at: datetime = _ts(nullable=False)


class EdgeTaskRow(SQLModel, table=True):
    """One dispatch of a job to a device. ``state``: dispatched, running, succeeded, failed, lost, refused,
    cancelled. The first terminal state wins; later outcomes are recorded in ``late_outcome`` only."""

    __tablename__ = "edge_tasks"
    task_id: str = Field(sa_column=sa.Column(sa.String(160), primary_key=True))
    job_id: str = Field(sa_column=sa.Column(sa.String(128), nullable=False, index=True))
    device_id: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, index=True))
    state: str = Field(sa_column=sa.Column(sa.String(16), nullable=False, index=True))
    body: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    expires_at: datetime = _ts(nullable=False)
    dispatched_at: datetime = _ts(nullable=False)
    updated_at: datetime = _ts(nullable=False)
    exit_code: int | None = Field(default=None, sa_column=sa.Column(sa.Integer, nullable=True))
    late_outcome: str | None = Field(default=None, sa_column=sa.Column(sa.String(32), nullable=True))


EDGE_TABLES = (EdgeDeviceRow, EnrollTokenRow, RevocationRow, CertIssuedRow, UplinkRow, EdgeTaskRow)


def device_labels(dev: EdgeDeviceRow | EnrollTokenRow) -> dict[str, str]:
    """The labels of a device (or those an enrollment token gives), as a dict."""
    try:
        value = json.loads(dev.labels or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _labels(value: Any, field: str) -> dict[str, str]:
    return {k: v or "" for k, v in validate_labels(value, field).items()}


def create_enroll_token(session: Session, namespace: str, *, now: datetime, ttl_seconds: float = 3600,
                        labels: Any = None) -> str:
    """Issue a one-time token for ``namespace`` valid ``ttl_seconds``; returns the token (shown once). The
    device it enrolls gets ``labels`` (Kubernetes-style, :func:`broker.spec.validate_labels`). Raises
    :class:`NotFoundError` when the namespace does not exist."""
    if not namespace or len(namespace) > 128:
        raise SpecError("namespace", "must be 1-128 characters. To fix: pass --namespace NAME")
    if ttl_seconds <= 0:
        raise SpecError("ttl_seconds", "must be positive. To fix: pass a positive --ttl")
    from broker.tenants import namespace_exists

    if not namespace_exists(session, namespace):  # a device enrolled into no namespace could never get work
        raise NotFoundError(f"namespace {namespace!r} not found. To fix: create it first (broker namespaces create "
                            "NAME) or check the name")
    given = _labels(labels, "labels")
    token = pki.new_token()
    session.add(EnrollTokenRow(token_sha256=pki.hash_token(token), namespace=namespace, created_at=now,
                               expires_at=now + timedelta(seconds=ttl_seconds), labels=json.dumps(given)))
    session.commit()
    return token


def _record_cert(session: Session, device_id: str, cert: Any) -> None:
    session.add(CertIssuedRow(serial=pki.serial_hex(cert), device_id=device_id, not_after=cert.not_valid_after_utc))


def enroll_device(
    session: Session,
    ca: pki.CertificateAuthority,
    token: str,
    csr_pem: str,
    *,
    now: datetime,
    cert_hours: float = pki.DEVICE_CERT_HOURS,
    labels: Any = None,
) -> tuple[EdgeDeviceRow, str]:
    """Redeem ``token`` (once) and sign the CSR; returns the device row and its certificate PEM. The device's
    labels are those it asks for (``labels``, e.g. ``edge-agent enroll --label``) overridden by the token's.

    Raises :class:`SpecError` (bad token/CSR) or :class:`ConflictError` (device id taken by a live device)."""
    asked = _labels(labels, "labels")
    row = session.get(EnrollTokenRow, pki.hash_token(token))
    if row is None or row.used_at is not None or utc(row.expires_at) <= now:
        raise SpecError("token", "unknown, used or expired enrollment token. To fix: issue a new one with "
                                 "`broker devices enroll-token --namespace N`")
    try:
        cert = ca.sign_csr(csr_pem, hours=cert_hours, now=now)
    except pki.PkiError as exc:
        raise SpecError("csr_pem", str(exc)) from None
    device_id = pki.device_id_of(cert)
    existing = session.get(EdgeDeviceRow, device_id)
    if existing is not None and existing.revoked_at is None:
        raise ConflictError(f"device {device_id!r} is already enrolled. To fix: choose another --device-id, "
                            "or revoke the old device first")
    # One-time: the conditional update makes concurrent redemptions of one token lose, not double-enroll.
    res = session.execute(
        sa.update(EnrollTokenRow).where(col(EnrollTokenRow.token_sha256) == row.token_sha256,
                                        col(EnrollTokenRow.used_at).is_(None))
        .values(used_at=now, device_id=device_id)
    )
    if getattr(res, "rowcount", 1) != 1:
        raise SpecError("token", "enrollment token was just used. To fix: issue a new one")
    pem = pki.cert_to_pem(cert)
    if existing is not None:
        session.delete(existing)
        session.flush()
    dev = EdgeDeviceRow(id=device_id, namespace=row.namespace, cert_pem=pem, cert_serial=pki.serial_hex(cert),
                        cert_not_after=cert.not_valid_after_utc, enrolled_at=now,
                        labels=json.dumps(dict(sorted({**asked, **device_labels(row)}.items()))))
    session.add(dev)
    _record_cert(session, device_id, cert)
    session.commit()
    return dev, pem


def renew_device(
    session: Session, ca: pki.CertificateAuthority, cert_pem: str, csr_pem: str, sig_b64: str, *, now: datetime,
    cert_hours: float = pki.DEVICE_CERT_HOURS,
) -> str:
    """Issue a fresh certificate to a device that proves it holds its current, valid, unrevoked one.

    Proof: ``sig_b64`` is the current key's ECDSA-SHA256 signature over the CSR PEM bytes, and the CSR is
    for the same key and CN. Raises :class:`SpecError` otherwise."""
    try:
        cert = pki.load_cert(cert_pem)
        pki.verify_issued_by(cert, ca.cert, now)
    except pki.PkiError as exc:
        raise SpecError("cert_pem", str(exc)) from None
    device_id = pki.device_id_of(cert)
    dev = session.get(EdgeDeviceRow, device_id)
    revoked = session.get(RevocationRow, pki.serial_hex(cert))
    if dev is None or dev.revoked_at is not None or revoked is not None:
        raise SpecError("cert_pem", "device is revoked or unknown. To fix: enroll it again with a new token")
    pub = cert.public_key()
    try:
        assert isinstance(pub, ec.EllipticCurvePublicKey)
        pub.verify(base64.b64decode(sig_b64), csr_pem.encode(), ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError, AssertionError):
        raise SpecError("sig", "proof of possession failed. To fix: sign the CSR with the device key") from None
    try:
        new = ca.sign_csr(csr_pem, device_id=device_id, hours=cert_hours, now=now)
    except pki.PkiError as exc:
        raise SpecError("csr_pem", str(exc)) from None
    if new.public_key() != pub:
        raise SpecError("csr_pem", "renewal must keep the device key. To fix: re-enroll to change keys")
    dev.cert_pem = pki.cert_to_pem(new)
    dev.cert_serial = pki.serial_hex(new)
    dev.cert_not_after = new.not_valid_after_utc
    session.add(dev)
    _record_cert(session, device_id, new)
    session.commit()
    return dev.cert_pem


def revoked_serials(session: Session) -> list[tuple[str, datetime]]:
    return [(r.serial, utc(r.revoked_at)) for r in session.exec(select(RevocationRow)).all()]


def write_crl(session: Session, ca: pki.CertificateAuthority, *, now: datetime) -> bytes:
    """Rewrite the CA's ``crl.pem`` from the store; returns the PEM."""
    ca.write_crl(revoked_serials(session), now=now)
    return (ca.directory / "crl.pem").read_bytes()


def revoke_device(
    session: Session, ca: pki.CertificateAuthority | None, device_id: str, *, now: datetime, reason: str = ""
) -> EdgeDeviceRow:
    """Revoke every certificate of ``device_id`` and rewrite the CRL (when ``ca`` is given). Idempotent.

    Mosquitto reads the CRL at start and on SIGHUP; the gateway refuses the device's messages at once."""
    dev = session.get(EdgeDeviceRow, device_id)
    if dev is None:
        raise NotFoundError(f"device {device_id!r} not found. To fix: check `broker devices list`")
    serials = {c.serial for c in session.exec(select(CertIssuedRow).where(CertIssuedRow.device_id == device_id))}
    serials.add(dev.cert_serial)
    for s in serials:
        if session.get(RevocationRow, s) is None:
            session.add(RevocationRow(serial=s, device_id=device_id, revoked_at=now, reason=reason[:256]))
    if dev.revoked_at is None:
        dev.revoked_at = now
    dev.online = False
    session.add(dev)
    session.commit()
    if ca is not None:
        write_crl(session, ca, now=now)
    return dev


def label_device(session: Session, device_id: str, patch: Any) -> EdgeDeviceRow:
    """Change a device's labels by a JSON merge patch: ``{key: value}`` sets, ``{key: null}`` removes
    (validated as :func:`broker.spec.validate_labels`; the result holds at most 64). Placement reads them
    at the next scheduling cycle."""
    changes = validate_labels(patch, "labels", allow_null=True)
    dev = get_device(session, device_id)
    merged = device_labels(dev)
    for k, v in changes.items():
        if v is None:
            merged.pop(k, None)
        else:
            merged[k] = v
    validate_labels(merged, "labels")  # the count limit holds for the result too
    dev.labels = json.dumps(dict(sorted(merged.items())))
    session.add(dev)
    session.commit()
    return dev


def get_device(session: Session, device_id: str) -> EdgeDeviceRow:
    dev = session.get(EdgeDeviceRow, device_id)
    if dev is None:
        raise NotFoundError(f"device {device_id!r} not found. To fix: check `broker devices list`")
    return dev


def is_online(dev: EdgeDeviceRow, now: datetime, offline_after_s: float = OFFLINE_AFTER_SECONDS) -> bool:
    """Seen within ``offline_after_s`` and not revoked."""
    return (dev.revoked_at is None and dev.last_seen is not None
            and (now - utc(dev.last_seen)).total_seconds() <= offline_after_s)


def list_devices(session: Session, *, namespace: str | None = None) -> Sequence[EdgeDeviceRow]:
    q = select(EdgeDeviceRow).order_by(col(EdgeDeviceRow.id))
    if namespace:
        q = q.where(EdgeDeviceRow.namespace == namespace)
    return session.exec(q).all()


def device_view(dev: EdgeDeviceRow, now: datetime) -> dict[str, Any]:
    """The JSON shape of a device in ``GET /v1/devices`` and ``broker devices list --json``."""

    def iso(d: datetime | None) -> str | None:
        return None if d is None else utc(d).isoformat()

    return {
        "id": dev.id, "namespace": dev.namespace,
        "status": "revoked" if dev.revoked_at else ("online" if is_online(dev, now) else "offline"),
        "last_seen": iso(dev.last_seen), "enrolled_at": iso(dev.enrolled_at), "revoked_at": iso(dev.revoked_at),
        "cert_not_after": iso(dev.cert_not_after), "vcpus": dev.vcpus, "memory_gib": dev.memory_gib,
        "gpus": dev.gpus, "accelerator": dev.accelerator, "arch": dev.arch, "disk_gib": dev.disk_gib,
        "bandwidth_mbps": dev.bandwidth_mbps, "latency_ms": dev.latency_ms, "agent_version": dev.agent_version,
        "labels": device_labels(dev),
    }


def _offerable(dev: EdgeDeviceRow, now: datetime, max_offline_s: float) -> bool:
    if dev.revoked_at is not None or dev.vcpus <= 0 or utc(dev.cert_not_after) <= now:
        return False
    if dev.last_seen is None:
        return False
    return (now - utc(dev.last_seen)).total_seconds() <= OFFLINE_AFTER_SECONDS + max_offline_s


def device_offers(
    session: Session, now: datetime, *, max_offline_s: float = 0.0, namespace: str | None = None
) -> list[Offer]:
    """Enrolled devices as offers (``provider="edge"``, ``region=<device id>``, ``Capacity.OWNED``).

    Offline-aware: a device offered must have been seen within ``OFFLINE_AFTER_SECONDS + max_offline_s``
    (``max_offline_s`` = how long the job can wait for a device to come back; 0 = online devices only).
    Revoked devices, expired certificates and devices that never reported capacity are left out.
    ``InstanceType.network_gbps`` is the measured bandwidth (``None`` when unmeasured)."""
    offers = []
    for dev in list_devices(session, namespace=namespace):
        if not _offerable(dev, now, max_offline_s):
            continue
        it = InstanceType(
            name=f"edge-{dev.id}", vcpus=dev.vcpus, memory_gib=dev.memory_gib, gpus=dev.gpus,
            accelerator=dev.accelerator, arch=dev.arch,
            network_gbps=None if dev.bandwidth_mbps is None else dev.bandwidth_mbps / 1000.0,
        )
        loc = Location(provider="edge", region=dev.id, site=SiteKind.EDGE, continent=dev.continent)
        offers.append(Offer(instance_type=it, location=loc, capacity=Capacity.OWNED, hourly_usd=dev.hourly_usd,
                            source="edge-registry"))
    return offers


def device_sites(session: Session, now: datetime, *, max_offline_s: float = 0.0,
                 default_uplink_gbps: float = 0.01) -> list[Any]:
    """One :class:`pricing.inventory.Site` per offered device: ``uplink_gbps`` from the measured bandwidth
    (``default_uplink_gbps`` when unmeasured), ``latency_ms`` measured, no egress charge.

    Feed them to ``EgressModel.with_sites(sites)`` so transfer time to a device uses its real link."""
    from pricing.inventory import Site

    sites = []
    for dev in list_devices(session):
        if not _offerable(dev, now, max_offline_s):
            continue
        gbps = dev.bandwidth_mbps / 1000.0 if dev.bandwidth_mbps else default_uplink_gbps
        sites.append(Site(name=dev.id, provider="edge", continent=dev.continent, uplink_gbps=gbps,
                          egress_usd_per_gib=0.0, ingress_usd_per_gib=0.0, latency_ms=dev.latency_ms))
    return sites


def uplink_bodies(session: Session, device_id: str, kind: str | None = None) -> list[tuple[int, dict[str, Any]]]:
    """``(seq, body)`` of a device's stored uplinks in seq order (for tests, reports and debugging)."""
    q = select(UplinkRow).where(UplinkRow.device_id == device_id)
    if kind:
        q = q.where(UplinkRow.kind == kind)
    return [(r.seq, json.loads(r.body)) for r in session.exec(q.order_by(col(UplinkRow.seq))).all()]
