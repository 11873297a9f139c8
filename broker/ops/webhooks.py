"""Signed alert webhooks.

The body is JSON; the header ``X-HB-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>`` signs
``"<t>." + body`` with the shared secret, so a receiver checks both integrity and freshness
(:func:`verify`, which rejects a signature older than ``tolerance_seconds``: a replayed request fails).
:class:`WebhookSender` makes one attempt per call; retries with exponential backoff are the caller's
schedule (:func:`retry_delay_seconds`), kept in the store so they survive restarts and need no sleeping.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

__all__ = ["SIGNATURE_HEADER", "sign", "verify", "retry_delay_seconds", "WebhookSender", "DeliveryResult"]

SIGNATURE_HEADER = "X-HB-Signature"


def sign(secret: str, body: bytes, t_seconds: int) -> str:
    """The signature header value for ``body`` sent at ``t_seconds``."""
    mac = hmac.new(secret.encode(), f"{t_seconds}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t_seconds},v1={mac}"


def verify(secret: str, body: bytes, header: str, now_seconds: float, tolerance_seconds: float = 300.0) -> bool:
    """True when ``header`` is a valid signature of ``body`` made within ``tolerance_seconds`` of now."""
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        t = int(parts["t"])
        given = parts["v1"]
    except (ValueError, KeyError):
        return False
    if abs(now_seconds - t) > tolerance_seconds:
        return False
    expected = sign(secret, body, t).split("v1=", 1)[1]
    return hmac.compare_digest(expected, given)


def retry_delay_seconds(attempts: int, base_seconds: float = 10.0, max_seconds: float = 600.0) -> float:
    """Delay before attempt ``attempts + 1`` after ``attempts`` failures: ``base * 2^(attempts-1)``, capped."""
    return min(max_seconds, base_seconds * 2 ** max(0, attempts - 1))


@dataclass(frozen=True)
class DeliveryResult:
    ok: bool
    status_code: int | None
    error: str


class WebhookSender:
    """POSTs signed JSON to ``url`` (one attempt per :meth:`send`; 2xx is success)."""

    def __init__(self, url: str, secret: str, *, timeout_seconds: float = 5.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook url {url!r}: expected http:// or https://")
        if not secret:
            raise ValueError("a webhook needs a secret to sign with")
        self.url = url
        self.secret = secret
        self.timeout_seconds = timeout_seconds

    def send(self, payload: Any, now_seconds: float) -> DeliveryResult:
        import httpx

        body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(self.secret, body, int(now_seconds))}
        try:
            r = httpx.post(self.url, content=body, headers=headers, timeout=self.timeout_seconds)
        except httpx.HTTPError as exc:
            return DeliveryResult(False, None, f"{type(exc).__name__}: {exc}")
        if 200 <= r.status_code < 300:
            return DeliveryResult(True, r.status_code, "")
        return DeliveryResult(False, r.status_code, f"HTTP {r.status_code}: {r.text[:200]}")
