"""Tenants: namespaces and API tokens.

A token is ``hb_<random>``; only its SHA-256 is stored, so a leaked database leaks no usable token.
An admin token (``namespace`` None) may do everything; a namespace token sees and touches only its own
namespace. Revoked tokens stay as rows (``revoked_at`` set) for the audit trail.

:class:`TokenCache` keeps the principals of recently seen token hashes for a few seconds so the request
path does not hash-and-look-up in the store on every call. Its contract: a revocation made through this
process (:meth:`TokenCache.invalidate` after the commit) takes effect at once; one made by another
process sharing the store takes effect here within :data:`TOKEN_CACHE_TTL_SECONDS`.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session

from broker.errors import ConflictError, NotFoundError, SpecError
from broker.store import NamespaceRow, Store, TokenRow

__all__ = [
    "Principal",
    "NAME_RE",
    "hash_token",
    "new_token",
    "validate_namespace_name",
    "create_namespace",
    "list_namespaces",
    "namespace_exists",
    "create_token",
    "list_tokens",
    "revoke_token",
    "authenticate",
    "lookup_token_hash",
    "ensure_admin_token",
    "TokenCache",
    "TOKEN_CACHE_TTL_SECONDS",
    "DEFAULT_NAMESPACE",
    "ensure_default_namespace",
]

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DEFAULT_NAMESPACE = "default"
TOKEN_PREFIX = "hb_"
# How long a validated token is trusted without asking the store again: the bound within which a
# revocation made by ANOTHER broker process (sharing PostgreSQL) takes effect in this one.
TOKEN_CACHE_TTL_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: an admin (``namespace`` None) or a namespace's token holder."""

    token_id: str
    namespace: str | None

    @property
    def is_admin(self) -> bool:
        return self.namespace is None

    def can_access(self, namespace: str) -> bool:
        """True when this principal may see ``namespace`` (admins see all)."""
        return self.namespace is None or self.namespace == namespace


def hash_token(token: str) -> str:
    """SHA-256 hex of ``token`` (what the store keeps)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits of entropy)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def validate_namespace_name(name: object) -> str:
    """``name`` when it is a DNS label (lowercase letters, digits, ``-``; 1..63); else :class:`SpecError`."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SpecError(
            "name",
            f"{name!r} is not a valid namespace name. To fix: use 1-63 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit (e.g. team-a)",
        )
    return name


def namespace_exists(session: Session, name: str) -> bool:
    return session.get(NamespaceRow, name) is not None


def create_namespace(session: Session, name: str, *, now: datetime) -> NamespaceRow:
    """Create namespace ``name``. Raises :class:`SpecError` (bad name) or :class:`ConflictError` (exists)."""
    validate_namespace_name(name)
    if session.get(NamespaceRow, name) is not None:
        raise ConflictError(f"namespace {name!r} already exists. To fix: pick another name, or use it as is")
    row = NamespaceRow(name=name, created_at=now)
    session.add(row)
    session.flush()
    return row


def list_namespaces(session: Session) -> list[NamespaceRow]:
    return list(session.scalars(sa.select(NamespaceRow).order_by(NamespaceRow.name)))  # type: ignore[arg-type]


def create_token(
    session: Session, namespace: str | None, *, now: datetime, description: str = "", secret: str | None = None
) -> tuple[TokenRow, str]:
    """Create a token for ``namespace`` (None = admin) and return the row and the secret (shown once).

    Raises :class:`NotFoundError` when the namespace does not exist.
    """
    if namespace is not None and session.get(NamespaceRow, namespace) is None:
        raise NotFoundError(
            f"namespace {namespace!r} does not exist. To fix: broker namespaces create {namespace}"
        )
    token = secret or new_token()
    row = TokenRow(
        id="tok_" + secrets.token_hex(8),
        namespace=namespace,
        token_hash=hash_token(token),
        description=description[:200],
        created_at=now,
    )
    session.add(row)
    session.flush()
    return row, token


def list_tokens(session: Session, namespace: str | None = None) -> list[TokenRow]:
    """Tokens of ``namespace`` (None = every token, admin ones included), oldest first. No secrets."""
    stmt = sa.select(TokenRow).order_by(TokenRow.created_at, TokenRow.id)  # type: ignore[arg-type]
    if namespace is not None:
        stmt = stmt.where(TokenRow.namespace == namespace)  # type: ignore[arg-type]
    return list(session.scalars(stmt))


def revoke_token(session: Session, token_id: str, *, now: datetime, namespace: str | None = None) -> TokenRow:
    """Revoke token ``token_id`` (idempotent). With ``namespace``, only a token of that namespace.

    Raises :class:`NotFoundError` when no such token exists.
    """
    row = session.get(TokenRow, token_id)
    if row is None or (namespace is not None and row.namespace != namespace):
        raise NotFoundError(f"token {token_id!r} not found. To fix: list tokens with broker tokens list")
    if row.revoked_at is None:
        row.revoked_at = now
        session.add(row)
        session.flush()
    return row


def authenticate(session: Session, token: str) -> Principal | None:
    """The principal of ``token``, or None when it is unknown or revoked."""
    if not token or len(token) > 512:
        return None
    return lookup_token_hash(session, hash_token(token))


def lookup_token_hash(session: Session, token_hash: str) -> Principal | None:
    """The principal of the token whose SHA-256 hex is ``token_hash``, or None when unknown or revoked."""
    row = session.execute(
        sa.select(TokenRow.id, TokenRow.namespace, TokenRow.revoked_at).where(  # type: ignore[call-overload]
            TokenRow.token_hash == token_hash
        )
    ).first()
    if row is None or row.revoked_at is not None:
        return None
    return Principal(token_id=row.id, namespace=row.namespace)


class TokenCache:
    """Principals of valid tokens by token hash, each trusted for ``ttl_seconds`` (thread-safe).

    Only valid tokens are kept (an unknown token is asked of the store every time, so random tokens
    cannot fill the cache), at most ``max_entries`` of them. :meth:`invalidate` empties the cache and
    bumps :attr:`epoch`; a lookup that started before (``put(..., epoch=<epoch read before the lookup>)``)
    is then dropped, so a revocation racing a cache fill can never leave the revoked token cached.
    ``monotonic`` is injectable for tests (it must be a real monotonic clock, never a frozen one).
    """

    def __init__(self, ttl_seconds: float = TOKEN_CACHE_TTL_SECONDS, *, max_entries: int = 10_000,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[Principal, float]] = {}
        self._epoch = 0

    @property
    def epoch(self) -> int:
        """Bumped by every :meth:`invalidate`; read it before a store lookup and pass it to :meth:`put`."""
        return self._epoch

    def get(self, token_hash: str) -> Principal | None:
        """The cached principal of ``token_hash`` when it is still fresh, else None."""
        entry = self._entries.get(token_hash)
        if entry is None:
            return None
        if entry[1] <= self._monotonic():
            with self._lock:
                if self._entries.get(token_hash) is entry:
                    del self._entries[token_hash]
            return None
        return entry[0]

    def put(self, token_hash: str, principal: Principal, *, epoch: int) -> None:
        """Cache ``principal`` unless the cache was invalidated since ``epoch`` was read."""
        if self.ttl_seconds <= 0:
            return
        with self._lock:
            if epoch != self._epoch:
                return
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[token_hash] = (principal, self._monotonic() + self.ttl_seconds)

    def invalidate(self) -> None:
        """Forget every cached token (call it after a revocation commits)."""
        with self._lock:
            self._epoch += 1
            self._entries.clear()


def ensure_default_namespace(session: Session, *, now: datetime) -> None:
    """Create the ``default`` namespace when it does not exist (no commit)."""
    if session.get(NamespaceRow, DEFAULT_NAMESPACE) is None:
        session.add(NamespaceRow(name=DEFAULT_NAMESPACE, created_at=now))
        session.flush()


def ensure_admin_token(store: Store, *, now: datetime, configured: str | None = None) -> str | None:
    """At first start, create the admin token (``configured`` when given, else a random one) and the
    ``default`` namespace; return the secret so the caller prints it once. Later starts return None.
    """
    with store.tx() as session:
        has_admin = session.execute(
            sa.select(TokenRow.id).where(TokenRow.namespace.is_(None)).limit(1)  # type: ignore[union-attr, call-overload]
        ).first()
        if has_admin is not None:
            return None
        ensure_default_namespace(session, now=now)
        _, secret = create_token(session, None, now=now, description="admin (first start)", secret=configured)
        return secret
