"""FastAPI dependencies shared by every router of the broker (this area's and the others').

Use them as ``Depends(...)``:

* :func:`get_settings` -> :class:`~broker.config.Settings`; :func:`get_store` -> :class:`~broker.store.Store`;
  :func:`get_clock` -> :class:`~broker.clock.Clock`.
* :func:`get_session` -> a :class:`sqlmodel.Session` for this request. It does not commit by itself: call
  ``session.commit()`` after writing; whatever is left uncommitted is rolled back when the request ends.
* :func:`current_principal` -> :class:`~broker.tenants.Principal` from ``Authorization: Bearer <token>``;
  401 when the token is missing, unknown or revoked.
* :func:`require_admin` -> the principal when it is an admin, else 403.
* :func:`require_namespace` (path parameter ``ns``) -> the namespace name when the caller may see it and it
  exists; 404 otherwise (a namespace token cannot even learn whether another namespace exists).

Everything but :func:`get_session` is ``async def`` and answers from memory in the common case (FastAPI
runs a plain ``def`` dependency in the threadpool: one thread hand-off per dependency per request). The
store is asked in the threadpool only on a miss: a token not seen for :data:`broker.tenants.TOKEN_CACHE_TTL_SECONDS`
(see :class:`broker.tenants.TokenCache` for when a revocation takes effect) or a namespace not seen yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel import Session

from broker.clock import Clock
from broker.config import Settings
from broker.store import Store
from broker.tenants import Principal, TokenCache, hash_token, lookup_token_hash, namespace_exists

__all__ = [
    "get_settings",
    "get_store",
    "get_clock",
    "get_session",
    "current_principal",
    "require_admin",
    "require_namespace",
    "get_state",
    "token_cache",
]


async def get_state(request: Request) -> Any:
    """The app's :class:`broker.app.AppState` (``request.app.state.hb``)."""
    return request.app.state.hb


async def get_settings(request: Request) -> Settings:
    return request.app.state.hb.settings  # type: ignore[no-any-return]


async def get_store(request: Request) -> Store:
    return request.app.state.hb.store  # type: ignore[no-any-return]


async def get_clock(request: Request) -> Clock:
    return request.app.state.hb.clock  # type: ignore[no-any-return]


def get_session(store: Annotated[Store, Depends(get_store)]) -> Iterator[Session]:
    with store.read() as session:
        yield session


def token_cache(hb: Any) -> TokenCache:
    """The :class:`TokenCache` of app state ``hb`` (made on first use)."""
    cache: TokenCache | None = getattr(hb, "token_cache", None)
    if cache is None:
        cache = TokenCache()
        hb.token_cache = cache
    return cache


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status_code=401, detail=message, headers={"WWW-Authenticate": "Bearer"})


def _lookup(store: Store, digest: str) -> Principal | None:
    with store.read() as session:
        return lookup_token_hash(session, digest)


# Declares the bearer scheme in the OpenAPI schema (the Authorize button of /docs); the header is checked below.
_BEARER = HTTPBearer(auto_error=False, scheme_name="bearerToken",
                     description="The admin token or a namespace token (broker tokens create -n NS).")


async def current_principal(
    request: Request, _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)] = None
) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _unauthorized("missing bearer token. To fix: send 'Authorization: Bearer <token>' (BROKER_TOKEN)")
    principal: Principal | None = None
    if len(token) <= 512:
        hb = request.app.state.hb
        cache = token_cache(hb)
        digest = hash_token(token)
        principal = cache.get(digest)
        if principal is None:
            epoch = cache.epoch
            principal = await run_in_threadpool(_lookup, hb.store, digest)
            if principal is not None:
                cache.put(digest, principal, epoch=epoch)
    if principal is None:
        raise _unauthorized("invalid or revoked token. To fix: ask an admin for a token (broker tokens create)")
    return principal


async def require_admin(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if not principal.is_admin:
        raise HTTPException(status_code=403, detail="this needs an admin token. To fix: use the admin token")
    return principal


def _namespace_exists(store: Store, ns: str) -> bool:
    with store.read() as session:
        return namespace_exists(session, ns)


async def require_namespace(
    ns: str,
    request: Request,
    principal: Annotated[Principal, Depends(current_principal)],
) -> str:
    not_found = HTTPException(
        status_code=404, detail=f"namespace {ns!r} not found. To fix: check the name (broker namespaces list)"
    )
    if not principal.can_access(ns):
        raise not_found
    hb = request.app.state.hb
    known: set[str] = hb.known_namespaces
    if ns not in known:
        if not await run_in_threadpool(_namespace_exists, hb.store, ns):
            raise not_found
        known.add(ns)
    return ns
