"""PKI of the edge fleet: the broker's CA, enrollment tokens, device certificates, CRLs.

Stdlib + ``cryptography`` only (the agent imports the device-side half). All keys are EC P-256
(TLS with Mosquitto 2.0 and OpenSSL 3 is reliable with it, and the same key signs envelopes).

Files of a CA directory (``broker ca init``)::

    ca.pem / ca.key (0600)          the CA that signs device, gateway and server certificates
    gateway.pem / gateway.key       client certificate of the broker's MQTT gateway (CN = hb-gateway);
                                    its key also signs every downlink envelope
    server.pem / server.key         Mosquitto's server certificate (SAN localhost, 127.0.0.1, extra hosts)
    crl.pem                         the CRL Mosquitto reads (``crlfile``); rewritten on every revocation

Contracts: device certificates are short-lived (``DEVICE_CERT_HOURS``), carry CN = device id and the
ClientAuth EKU; enrollment tokens are one-time and only their SHA-256 is ever stored.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "GATEWAY_IDENTITY",
    "DEVICE_CERT_HOURS",
    "DEVICE_ID_RE",
    "PkiError",
    "CertificateAuthority",
    "generate_key",
    "key_to_pem",
    "load_key",
    "load_cert",
    "cert_to_pem",
    "make_csr",
    "new_token",
    "hash_token",
    "validate_device_id",
    "device_id_of",
    "serial_hex",
    "needs_renewal",
    "verify_issued_by",
    "write_private",
]

GATEWAY_IDENTITY = "hb-gateway"
DEVICE_CERT_HOURS = 72.0
CRL_VALID_HOURS = 24.0 * 7
# Device ids end up in MQTT topics and Mosquitto's %u ACL pattern: no '/', '+', '#', and the
# reserved prefix "hb-" (the gateway's identity) is refused.
DEVICE_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")


class PkiError(ValueError):
    """A certificate, CSR or token is unusable; the message says why and what to do."""


def _now() -> datetime:
    return datetime.now(UTC)


def generate_key() -> ec.EllipticCurvePrivateKey:
    """A fresh EC P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def key_to_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def load_key(path: str | Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{path}: not an EC private key. To fix: regenerate it with `broker ca init --force`")
    return key


def load_cert(data: str | bytes | Path) -> x509.Certificate:
    """A certificate from PEM text/bytes or from a file path."""
    if isinstance(data, Path):
        data = data.read_bytes()
    if isinstance(data, str):
        data = data.encode()
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise PkiError(f"not a PEM certificate ({exc}). To fix: send the PEM text of the certificate") from exc


def cert_to_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte (never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)


def serial_hex(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


def validate_device_id(device_id: str) -> str:
    """Return ``device_id`` when it is a valid device id, else raise :class:`PkiError`."""
    if not DEVICE_ID_RE.match(device_id) or device_id.startswith("hb-"):
        raise PkiError(
            f"device id {device_id!r} is invalid. To fix: use 2-63 chars of a-z, 0-9 and '-', "
            "starting with a letter or digit and not with 'hb-'"
        )
    return device_id


def device_id_of(cert: x509.Certificate) -> str:
    """The CN of ``cert`` (the device or service identity)."""
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not attrs:
        raise PkiError("certificate has no CN. To fix: re-enroll the device")
    value = attrs[0].value
    return value if isinstance(value, str) else value.decode()


def make_csr(key: ec.EllipticCurvePrivateKey, device_id: str) -> bytes:
    """A PEM CSR with CN = ``device_id``, signed by ``key`` (which stays on the device)."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device_id)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def new_token() -> str:
    """A fresh one-time enrollment token (256 random bits)."""
    return "hbe_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The SHA-256 hex digest under which a token is stored (the token itself never is)."""
    return hashlib.sha256(token.strip().encode()).hexdigest()


def needs_renewal(cert: x509.Certificate, now: datetime | None = None, fraction_left: float = 1 / 3) -> bool:
    """True when less than ``fraction_left`` of the certificate's lifetime remains."""
    now = now or _now()
    total = (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds()
    left = (cert.not_valid_after_utc - now).total_seconds()
    return left < total * fraction_left


def verify_issued_by(cert: x509.Certificate, ca_cert: x509.Certificate, now: datetime | None = None) -> None:
    """Raise :class:`PkiError` unless ``cert`` was signed by ``ca_cert`` and is valid at ``now``."""
    now = now or _now()
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise PkiError("certificate was not issued by this broker's CA. To fix: re-enroll the device") from exc
    if now < cert.not_valid_before_utc:
        raise PkiError("certificate is not valid yet. To fix: check the device clock")
    if now >= cert.not_valid_after_utc:
        raise PkiError(
            "certificate has expired. To fix: re-enroll the device with a new token "
            "(`broker devices enroll-token`)"
        )


def _leaf_builder(
    cn: str, public_key: ec.EllipticCurvePublicKey, issuer: x509.Name, now: datetime, hours: float
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=hours))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )


@dataclass(frozen=True)
class CertificateAuthority:
    """The broker's CA: its certificate and private key, and the directory they live in."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    directory: Path

    @property
    def cert_pem(self) -> str:
        return cert_to_pem(self.cert)

    @classmethod
    def init(
        cls,
        directory: str | Path,
        *,
        name: str = "hybrid-broker CA",
        days: int = 3650,
        server_hosts: Sequence[str] = ("localhost", "127.0.0.1"),
        force: bool = False,
        now: datetime | None = None,
    ) -> CertificateAuthority:
        """Create a CA in ``directory`` with the gateway and Mosquitto server certificates and an empty CRL.

        Refuses (:class:`PkiError`) when a CA already exists there, unless ``force``."""
        d = Path(directory)
        if (d / "ca.key").exists() and not force:
            raise PkiError(f"a CA already exists in {d}. To fix: use it, or pass --force to replace it")
        d.mkdir(parents=True, exist_ok=True)
        now = now or _now()
        key = generate_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        ku = x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False,
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(ku, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        write_private(d / "ca.key", key_to_pem(key))
        (d / "ca.pem").write_text(cert_to_pem(cert))
        ca = cls(cert=cert, key=key, directory=d)
        ca.write_identity("gateway", GATEWAY_IDENTITY, hours=24 * 365, now=now)
        ca.write_identity("server", "mosquitto", hours=24 * 365, server_hosts=server_hosts, now=now)
        ca.write_crl([], now=now)
        return ca

    @classmethod
    def load(cls, directory: str | Path) -> CertificateAuthority:
        d = Path(directory)
        if not (d / "ca.key").exists():
            raise PkiError(f"no CA in {d}. To fix: run `broker ca init` first")
        return cls(cert=load_cert(d / "ca.pem"), key=load_key(d / "ca.key"), directory=d)

    def issue(
        self,
        cn: str,
        public_key: ec.EllipticCurvePublicKey,
        *,
        hours: float,
        server_hosts: Sequence[str] = (),
        now: datetime | None = None,
    ) -> x509.Certificate:
        """Sign a leaf for ``cn``: ServerAuth with SANs when ``server_hosts`` is given, else ClientAuth."""
        now = now or _now()
        b = _leaf_builder(cn, public_key, self.cert.subject, now, hours)
        if server_hosts:
            sans: list[x509.GeneralName] = []
            for h in server_hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        else:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        return b.sign(self.key, hashes.SHA256())

    def write_identity(
        self,
        stem: str,
        cn: str,
        *,
        hours: float,
        server_hosts: Sequence[str] = (),
        now: datetime | None = None,
    ) -> tuple[Path, Path]:
        """Generate a key and certificate for ``cn`` into ``<stem>.pem`` / ``<stem>.key``; return both paths."""
        key = generate_key()
        cert = self.issue(cn, key.public_key(), hours=hours, server_hosts=server_hosts, now=now)
        write_private(self.directory / f"{stem}.key", key_to_pem(key))
        (self.directory / f"{stem}.pem").write_text(cert_to_pem(cert))
        return self.directory / f"{stem}.pem", self.directory / f"{stem}.key"

    def sign_csr(
        self,
        csr_pem: str | bytes,
        *,
        device_id: str | None = None,
        hours: float = DEVICE_CERT_HOURS,
        now: datetime | None = None,
    ) -> x509.Certificate:
        """Sign a device CSR into a short-lived ClientAuth certificate with CN = device id.

        The CSR's own signature is checked; its CN must equal ``device_id`` when that is given and must be
        a valid device id. Raises :class:`PkiError` otherwise."""
        data = csr_pem.encode() if isinstance(csr_pem, str) else csr_pem
        try:
            csr = x509.load_pem_x509_csr(data)
        except ValueError as exc:
            raise PkiError(f"csr is not a PEM certificate request ({exc}). To fix: send the CSR PEM") from exc
        if not csr.is_signature_valid:
            raise PkiError("csr signature is invalid. To fix: regenerate the CSR with the device key")
        pub = csr.public_key()
        if not isinstance(pub, ec.EllipticCurvePublicKey) or not isinstance(pub.curve, ec.SECP256R1):
            raise PkiError("csr key must be EC P-256. To fix: generate the device key with edge-agent enroll")
        attrs = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        cn = attrs[0].value if attrs else ""
        cn = cn if isinstance(cn, str) else cn.decode()
        if device_id is not None and cn != device_id:
            raise PkiError(f"csr CN {cn!r} does not match device {device_id!r}. To fix: keep the device id")
        validate_device_id(cn)
        return self.issue(cn, pub, hours=hours, now=now)

    def crl(
        self, revoked: Iterable[tuple[str, datetime]], *, now: datetime | None = None,
        hours: float = CRL_VALID_HOURS,
    ) -> bytes:
        """A PEM CRL listing ``(serial_hex, revoked_at)`` pairs, valid for ``hours``."""
        now = now or _now()
        b = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.cert.subject)
            .last_update(now - timedelta(minutes=5))
            .next_update(now + timedelta(hours=hours))
        )
        for serial, when in revoked:
            b = b.add_revoked_certificate(
                x509.RevokedCertificateBuilder().serial_number(int(serial, 16)).revocation_date(when).build()
            )
        return b.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    def write_crl(self, revoked: Iterable[tuple[str, datetime]], *, now: datetime | None = None) -> Path:
        """Rewrite ``crl.pem`` atomically (Mosquitto re-reads it on SIGHUP / restart)."""
        path = self.directory / "crl.pem"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(self.crl(revoked, now=now))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        return path
