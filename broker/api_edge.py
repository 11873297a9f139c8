"""HTTP API of the edge fleet (mounted with ``app.include_router(broker.api_edge.router)``).

* ``POST /v1/edge/enroll`` ``{token, csr_pem}`` -> ``{device_id, cert_pem, ca_pem, gateway_cert_pem, mqtt_url}``
  (no auth: the one-time token is the credential).
* ``POST /v1/edge/renew`` ``{cert_pem, csr_pem, sig}`` -> ``{cert_pem}`` (proof of possession of the key).
* ``GET /v1/edge/crl`` -> the current CRL (PEM).
* ``GET /v1/edge/probe?bytes=N`` -> N bytes (N <= 16 MiB), for the agents' bandwidth measurement.
* ``POST /v1/edge/ca`` ``{hosts, force}`` -> ``{directory, ca_pem, files}`` (admin): creates the broker CA on
  the server (409 when one exists, unless ``force``), so ``broker ca init`` works against a remote broker.
* ``POST /v1/edge/enroll-tokens`` ``{namespace, ttl_seconds, labels}`` -> ``{token, expires_at}`` (admin); the
  enrolled device gets ``labels``.
* ``GET /v1/devices`` -> the device registry (admin); ``PATCH /v1/devices/{id}`` ``{labels}`` (admin, a merge
  patch of the device's labels); ``POST /v1/devices/{id}:revoke`` (admin).

The CA lives in ``<data dir>/ca`` (or next to ``BROKER_CA_KEY_FILE``); override :func:`get_ca` in tests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field
from sqlmodel import Session

from broker import devices
from broker.api_deps import get_clock, get_session, get_settings, require_admin
from broker.clock import Clock
from broker.config import Settings
from broker.errors import ConflictError, NotFoundError, SpecError
from edge import pki

__all__ = ["router", "get_ca", "ca_dir_of"]

router = APIRouter(tags=["edge"])


def ca_dir_of(settings: Settings) -> Path:
    """``BROKER_CA_KEY_FILE``'s directory when set, else ``<data dir>/ca``."""
    return settings.ca_key_file.parent if settings.ca_key_file else Path(settings.data_dir) / "ca"


def get_ca(settings: Annotated[Settings, Depends(get_settings)]) -> pki.CertificateAuthority:
    try:
        return pki.CertificateAuthority.load(ca_dir_of(settings))
    except pki.PkiError as exc:  # the reason names paths of the data dir: logged, not told to the caller
        logging.getLogger("broker.edge").warning("the edge CA is unusable: %s", exc)
        raise HTTPException(status_code=503, detail="the edge CA of this broker is not set up. To fix: an admin "
                                                    "runs `broker ca init` (see the server log)") from None


class EnrollIn(BaseModel):
    token: str = Field(min_length=8, max_length=256)
    csr_pem: str = Field(min_length=64, max_length=16384)
    labels: dict[str, str] = Field(default_factory=dict, description="labels the device asks for (the token's win)")


class RenewIn(BaseModel):
    cert_pem: str = Field(min_length=64, max_length=16384)
    csr_pem: str = Field(min_length=64, max_length=16384)
    sig: str = Field(min_length=8, max_length=1024)


LabelValue = str | int | float | bool


class TokenIn(BaseModel):
    namespace: str = Field(min_length=1, max_length=128)
    ttl_seconds: float = Field(default=3600, gt=0, le=30 * 86400)
    labels: dict[str, LabelValue] = Field(default_factory=dict, description="labels of the device it enrolls")


class LabelsIn(BaseModel):
    labels: dict[str, LabelValue | None] = Field(
        description="a JSON merge patch: key: value sets a label, key: null removes it")


class CaIn(BaseModel):
    hosts: list[Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.:-]+$")]] = Field(
        default_factory=list, max_length=32)
    force: bool = False


def _http(exc: Exception) -> HTTPException:
    if isinstance(exc, NotFoundError):
        return HTTPException(status_code=404, detail=str(exc))
    if isinstance(exc, ConflictError):
        return HTTPException(status_code=409, detail=str(exc))
    return HTTPException(status_code=400, detail=str(exc))


@router.post("/v1/edge/enroll")
def enroll(
    body: EnrollIn,
    session: Annotated[Session, Depends(get_session)],
    ca: Annotated[pki.CertificateAuthority, Depends(get_ca)],
    settings: Annotated[Settings, Depends(get_settings)],
    clock: Annotated[Clock, Depends(get_clock)],
) -> dict[str, Any]:
    """Enroll a device: a one-time enrollment token and the device's CSR -> its short-lived certificate
    (CN = device id), the CA and the MQTT endpoint. The token is the credential; it works once."""
    try:
        dev, pem = devices.enroll_device(session, ca, body.token, body.csr_pem, now=clock.now(),
                                         labels=body.labels)
    except (SpecError, ConflictError) as exc:
        raise _http(exc) from None
    gw = ca.directory / "gateway.pem"
    return {"device_id": dev.id, "namespace": dev.namespace, "labels": devices.device_labels(dev),
            "cert_pem": pem, "ca_pem": ca.cert_pem,
            "gateway_cert_pem": gw.read_text() if gw.exists() else "", "mqtt_url": settings.mqtt_url or ""}


@router.post("/v1/edge/renew")
def renew(
    body: RenewIn,
    session: Annotated[Session, Depends(get_session)],
    ca: Annotated[pki.CertificateAuthority, Depends(get_ca)],
    clock: Annotated[Clock, Depends(get_clock)],
) -> dict[str, Any]:
    """Renew a device certificate before it expires: the current certificate, a new CSR and a signature
    by the current key prove the caller is the device. Revoked devices are refused."""
    try:
        pem = devices.renew_device(session, ca, body.cert_pem, body.csr_pem, body.sig, now=clock.now())
    except SpecError as exc:
        raise _http(exc) from None
    return {"cert_pem": pem}


@router.get("/v1/edge/crl")
def crl(
    session: Annotated[Session, Depends(get_session)],
    ca: Annotated[pki.CertificateAuthority, Depends(get_ca)],
    clock: Annotated[Clock, Depends(get_clock)],
) -> Response:
    """The broker CA's certificate revocation list (PEM), for Mosquitto's ``crlfile`` and for devices."""
    pem = ca.crl(devices.revoked_serials(session), now=clock.now())
    return Response(content=pem, media_type="application/pkix-crl")


@router.get("/v1/edge/probe")
def probe(nbytes: Annotated[int, Query(alias="bytes", ge=1, le=16 << 20)] = 1 << 20) -> Response:
    """A payload of ``bytes`` zero bytes (at most 16 MiB) that agents download to measure their link bandwidth.

    \f
    Streamed in 64 KiB chunks of one shared buffer: an unauthenticated caller asking many times at once costs
    bandwidth, not 16 MiB of memory per request."""

    def zeros() -> Iterator[bytes]:
        left = nbytes
        while left > 0:
            yield _ZEROS[: min(left, len(_ZEROS))]
            left -= len(_ZEROS)

    return StreamingResponse(zeros(), media_type="application/octet-stream",
                             headers={"Content-Length": str(nbytes)})


_ZEROS = bytes(64 * 1024)


@router.post("/v1/edge/ca", status_code=201)
def init_ca(
    body: CaIn,
    settings: Annotated[Settings, Depends(get_settings)],
    _admin: Annotated[Any, Depends(require_admin)],
) -> dict[str, Any]:
    """Create the broker CA on the server (admin): EC P-256 key 0600, the gateway and Mosquitto server
    certificates (``hosts`` are extra SANs of the latter) and an empty CRL. 409 when a CA exists, unless
    ``force``."""
    d = ca_dir_of(settings)
    try:
        ca = pki.CertificateAuthority.init(d, server_hosts=("localhost", "127.0.0.1", *body.hosts), force=body.force)
    except pki.PkiError as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None
    return {"directory": str(d), "ca_pem": ca.cert_pem,
            "files": ["ca.pem", "ca.key", "gateway.pem", "gateway.key", "server.pem", "server.key", "crl.pem"]}


@router.post("/v1/edge/enroll-tokens", status_code=201)
def create_token(
    body: TokenIn,
    session: Annotated[Session, Depends(get_session)],
    clock: Annotated[Clock, Depends(get_clock)],
    _admin: Annotated[Any, Depends(require_admin)],
) -> dict[str, Any]:
    """Issue a one-time, expiring enrollment token for a namespace (admin). Only its hash is stored. The
    namespace must exist (404 otherwise): a device enrolled into no namespace could never get work."""
    now = clock.now()
    try:
        token = devices.create_enroll_token(session, body.namespace, now=now, ttl_seconds=body.ttl_seconds,
                                            labels=body.labels)
    except (SpecError, NotFoundError) as exc:
        raise _http(exc) from None
    return {"token": token, "namespace": body.namespace, "labels": body.labels,
            "expires_at": (now + timedelta(seconds=body.ttl_seconds)).isoformat()}


@router.get("/v1/devices")
def list_devices(
    session: Annotated[Session, Depends(get_session)],
    clock: Annotated[Clock, Depends(get_clock)],
    _admin: Annotated[Any, Depends(require_admin)],
    namespace: str | None = None,
) -> dict[str, Any]:
    """The device registry (admin): last seen, online/offline, capacity, link quality, agent version."""
    now = clock.now()
    return {"devices": [devices.device_view(d, now) for d in devices.list_devices(session, namespace=namespace)]}


@router.patch("/v1/devices/{device_id}")
def label(
    device_id: str,
    body: LabelsIn,
    session: Annotated[Session, Depends(get_session)],
    clock: Annotated[Clock, Depends(get_clock)],
    _admin: Annotated[Any, Depends(require_admin)],
) -> dict[str, Any]:
    """Change a device's labels (admin), which jobs select with ``placement.nodeSelector``: a merge patch
    (``{"labels": {"zone": "lab", "old": null}}`` sets ``zone`` and removes ``old``). 400 for an invalid
    key or value, 404 for an unknown device."""
    try:
        dev = devices.label_device(session, device_id, body.labels)
    except (SpecError, NotFoundError) as exc:
        raise _http(exc) from None
    return devices.device_view(dev, clock.now())


@router.post("/v1/devices/{device_id}:revoke")
def revoke(
    device_id: str,
    _admin: Annotated[Any, Depends(require_admin)],  # first: a caller without the admin token learns nothing more
    session: Annotated[Session, Depends(get_session)],
    ca: Annotated[pki.CertificateAuthority, Depends(get_ca)],
    clock: Annotated[Clock, Depends(get_clock)],
) -> dict[str, Any]:
    """Revoke a device (admin): its certificate goes on the CRL that Mosquitto and the gateway check."""
    now = clock.now()
    try:
        dev = devices.revoke_device(session, ca, device_id, now=now, reason="revoked via API")
    except NotFoundError as exc:
        raise _http(exc) from None
    return devices.device_view(dev, now)
