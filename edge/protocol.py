"""The edge wire protocol: topics, the signed envelope, its canonical encoding, and receipt checks.

Topics: ``hb/v1/dev/{device}/up/{kind}`` (device -> broker) and ``hb/v1/dev/{device}/down/{kind}``
(broker -> device). Every payload is an envelope::

    {"v": 1, "id": "<unique>", "device": "<device id>", "seq": <int>, "ts": <unix ms>,
     "kind": "<kind>", "body": {...}, "sig": "<base64 ECDSA-P256-SHA256 over canonical(envelope - sig)>"}

``canonical`` is sorted-key compact JSON in UTF-8. Uplinks are signed with the device key (the key of
its client certificate), downlinks with the gateway key. ``device`` is the device the message is from
(up) or for (down). ``seq`` grows strictly per sender; uplink seqs are contiguous per device (0, 1, 2,
...), so the gateway tells a gap (a loss on the way: ``gap``, re-sent by the agent) from a replay.
``ts`` is the time of sending (a re-send from a durable outbox is re-signed with a fresh ``ts`` but keeps
``id`` and ``seq``).

Receivers use :func:`open_envelope` (size, shape, version) then :class:`Verifier` (identity,
signature, time window, sequence, duplicates). Every rejection raises :class:`Rejected` with a
reason from :data:`REASONS`; :class:`RejectionCounter` counts them. Stdlib + cryptography only.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

__all__ = [
    "VERSION",
    "TOPIC_ROOT",
    "MAX_PAYLOAD_BYTES",
    "WINDOW_SECONDS",
    "REASONS",
    "UP_KINDS",
    "DOWN_KINDS",
    "Envelope",
    "Rejected",
    "RejectionCounter",
    "Verifier",
    "canonical",
    "up_topic",
    "down_topic",
    "parse_topic",
    "seal",
    "open_envelope",
    "verify_signature",
    "verify_shape",
    "MAX_DEPTH",
    "now_ms",
]

VERSION = 1
TOPIC_ROOT = "hb/v1/dev"
MAX_PAYLOAD_BYTES = 256 * 1024
WINDOW_SECONDS = 300.0
MAX_DEPTH = 32  # deepest nesting of a body (dicts and lists) a receiver accepts

UP_KINDS = frozenset({"hello", "heartbeat", "capacity", "status", "result", "telemetry"})
DOWN_KINDS = frozenset({"task", "cancel", "ack"})

# Rejection reasons (also the label values of the gateway's counter).
OVERSIZE = "oversize"
MALFORMED = "malformed"
VERSION_MISMATCH = "version"
UNKNOWN_SENDER = "unknown_sender"
REVOKED = "revoked"
IDENTITY = "identity_mismatch"
SIGNATURE = "bad_signature"
STALE = "stale"
REPLAY = "replay"
DUPLICATE = "duplicate"
GAP = "gap"  # uplink seq skipped ahead (messages lost on the way): refused, the agent goes back and re-sends
REASONS = (OVERSIZE, MALFORMED, VERSION_MISMATCH, UNKNOWN_SENDER, REVOKED, IDENTITY, SIGNATURE, STALE,
           REPLAY, DUPLICATE, GAP)


def now_ms() -> int:
    return int(time.time() * 1000)


class Rejected(Exception):
    """A message was refused on receipt. ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class RejectionCounter:
    """Plain per-reason counts (no prometheus needed on the device). ``on_reject`` is called per count."""

    counts: dict[str, int] = field(default_factory=dict)
    on_reject: Callable[[str], None] | None = None

    def add(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if self.on_reject is not None:
            self.on_reject(reason)

    def total(self) -> int:
        return sum(self.counts.values())


def canonical(obj: Mapping[str, Any]) -> bytes:
    """Sorted-key compact JSON, UTF-8 (no ASCII escaping): the bytes that are signed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def up_topic(device: str, kind: str) -> str:
    return f"{TOPIC_ROOT}/{device}/up/{kind}"


def down_topic(device: str, kind: str) -> str:
    return f"{TOPIC_ROOT}/{device}/down/{kind}"


def parse_topic(topic: str) -> tuple[str, str, str]:
    """``hb/v1/dev/{device}/{up|down}/{kind}`` -> ``(device, direction, kind)``; :class:`Rejected` otherwise."""
    parts = topic.split("/")
    if len(parts) != 6 or "/".join(parts[:3]) != TOPIC_ROOT or parts[4] not in ("up", "down"):
        raise Rejected(MALFORMED, f"topic {topic!r} is not {TOPIC_ROOT}/<device>/<up|down>/<kind>")
    return parts[3], parts[4], parts[5]


@dataclass(frozen=True, slots=True)
class Envelope:
    """One received or sent message. ``ts`` is Unix milliseconds at sending."""

    v: int
    id: str
    device: str
    seq: int
    ts: int
    kind: str
    body: Mapping[str, Any]
    sig: str = ""

    def unsigned(self) -> dict[str, Any]:
        return {"v": self.v, "id": self.id, "device": self.device, "seq": self.seq, "ts": self.ts,
                "kind": self.kind, "body": self.body}


def seal(
    kind: str,
    body: Mapping[str, Any],
    *,
    device: str,
    seq: int,
    key: ec.EllipticCurvePrivateKey,
    id: str | None = None,
    ts: int | None = None,
) -> bytes:
    """Build, sign and encode an envelope. ``id`` defaults to a fresh UUID4, ``ts`` to now."""
    env = {"v": VERSION, "id": id or uuid.uuid4().hex, "device": device, "seq": int(seq),
           "ts": now_ms() if ts is None else int(ts), "kind": kind, "body": dict(body)}
    sig = key.sign(canonical(env), ec.ECDSA(hashes.SHA256()))
    env["sig"] = base64.b64encode(sig).decode()
    return canonical(env)


def open_envelope(payload: bytes, *, max_bytes: int = MAX_PAYLOAD_BYTES) -> Envelope:
    """Parse and shape-check a payload (no signature check yet). Raises :class:`Rejected`."""
    if len(payload) > max_bytes:
        raise Rejected(OVERSIZE, f"{len(payload)} bytes > {max_bytes}")
    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Rejected(MALFORMED, f"not JSON: {exc}") from None
    except RecursionError:
        raise Rejected(MALFORMED, f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if not isinstance(raw, dict):
        raise Rejected(MALFORMED, "envelope is not an object")
    if raw.get("v") != VERSION:
        raise Rejected(VERSION_MISMATCH, f"v={raw.get('v')!r}, expected {VERSION}")
    types: dict[str, type | tuple[type, ...]] = {"id": str, "device": str, "seq": int, "ts": int,
                                                 "kind": str, "body": dict, "sig": str}
    for k, t in types.items():
        if k not in raw or not isinstance(raw[k], t) or isinstance(raw[k], bool):
            raise Rejected(MALFORMED, f"field {k!r} missing or not {getattr(t, '__name__', t)}")
    if set(raw) - set(types) - {"v"}:
        raise Rejected(MALFORMED, f"unknown fields {sorted(set(raw) - set(types) - {'v'})}")
    if not raw["id"] or len(raw["id"]) > 128:
        raise Rejected(MALFORMED, "id must be 1-128 chars")
    env = Envelope(v=VERSION, id=raw["id"], device=raw["device"], seq=raw["seq"], ts=raw["ts"],
                   kind=raw["kind"], body=raw["body"], sig=raw["sig"])
    verify_shape(env)
    return env


def verify_shape(env: Envelope, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`Rejected` (``malformed``) when ``env.body`` nests deeper than ``max_depth`` (checked
    without recursion, so a hostile payload cannot exhaust the stack of a receiver)."""
    stack: list[tuple[Any, int]] = [(env.body, 1)]
    while stack:
        obj, depth = stack.pop()
        if depth > max_depth:
            raise Rejected(MALFORMED, f"body nested deeper than {max_depth} levels")
        if isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values())
        elif isinstance(obj, list):
            stack.extend((v, depth + 1) for v in obj)


def verify_signature(env: Envelope, public_key: ec.EllipticCurvePublicKey) -> None:
    """Raise :class:`Rejected` (``bad_signature``) unless ``env.sig`` signs ``canonical(env - sig)``."""
    try:
        sig = base64.b64decode(env.sig, validate=True)
        public_key.verify(sig, canonical(env.unsigned()), ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError) as exc:
        raise Rejected(SIGNATURE, "signature does not verify with the sender's key") from exc


class Verifier:
    """In-memory receipt checks for one receiver, state kept per device.

    ``check(env, device=..., public_key=..., now=...)`` enforces, in order: envelope device = ``device``
    (uplink: the identity the transport authenticated; downlink: the receiving device), signature,
    ``|ts - now| <= window``, then the duplicate id check (``duplicate``: a redelivery, harmless) and
    ``seq`` strictly above the last accepted one (``replay``). ``accept(env)`` records it. Seen ids are
    remembered up to ``max_ids`` per device.

    ``ordered=False`` drops the seq check: for downlinks, which several gateway replicas send (their seqs
    are not one sequence and may arrive out of turn) and which are all idempotent (a task id is applied
    once, a cancel or an ack twice changes nothing), so the id check and the time window are enough.
    """

    def __init__(self, *, window_seconds: float = WINDOW_SECONDS, max_ids: int = 10_000,
                 ordered: bool = True) -> None:
        self.window_ms = int(window_seconds * 1000)
        self.ordered = ordered
        self.max_ids = max_ids
        self.last_seq: dict[str, int] = {}
        self._seen: dict[str, OrderedDict[str, None]] = {}

    def check(
        self, env: Envelope, *, device: str, public_key: ec.EllipticCurvePublicKey, now: int | None = None
    ) -> None:
        if env.device != device:
            raise Rejected(IDENTITY, f"envelope device {env.device!r} != authenticated device {device!r}")
        verify_signature(env, public_key)
        now = now_ms() if now is None else now
        if abs(env.ts - now) > self.window_ms:
            raise Rejected(STALE, f"ts {env.ts} is {abs(env.ts - now) / 1000:.0f} s from now")
        if env.id in self._seen.get(device, ()):
            raise Rejected(DUPLICATE, f"id {env.id} already received")
        if self.ordered and env.seq <= self.last_seq.get(device, -1):
            raise Rejected(REPLAY, f"seq {env.seq} <= last {self.last_seq.get(device)}")

    def accept(self, env: Envelope) -> None:
        self.last_seq[env.device] = max(env.seq, self.last_seq.get(env.device, -1))
        seen = self._seen.setdefault(env.device, OrderedDict())
        seen[env.id] = None
        while len(seen) > self.max_ids:
            seen.popitem(last=False)
