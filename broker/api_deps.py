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
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from sqlmodel import Session

from broker.clock import Clock
from broker.config import Settings
from broker.store import Store
from broker.tenants import Principal, authenticate, namespace_exists

__all__ = [
    "get_settings",
    "get_store",
    "get_clock",
    "get_session",
    "current_principal",
    "require_admin",
    "require_namespace",
    "get_state",
]


def get_state(request: Request) -> Any:
    """The app's :class:`broker.app.AppState` (``request.app.state.hb``)."""
    return request.app.state.hb


def get_settings(request: Request) -> Settings:
    return request.app.state.hb.settings  # type: ignore[no-any-return]


def get_store(request: Request) -> Store:
    return request.app.state.hb.store  # type: ignore[no-any-return]


def get_clock(request: Request) -> Clock:
    return request.app.state.hb.clock  # type: ignore[no-any-return]


def get_session(store: Annotated[Store, Depends(get_store)]) -> Iterator[Session]:
    with store.read() as session:
        yield session


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status_code=401, detail=message, headers={"WWW-Authenticate": "Bearer"})


def current_principal(request: Request, store: Annotated[Store, Depends(get_store)]) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("missing bearer token. To fix: send 'Authorization: Bearer <token>' (BROKER_TOKEN)")
    with store.read() as session:
        principal = authenticate(session, token.strip())
    if principal is None:
        raise _unauthorized("invalid or revoked token. To fix: ask an admin for a token (broker tokens create)")
    return principal


def require_admin(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if not principal.is_admin:
        raise HTTPException(status_code=403, detail="this needs an admin token. To fix: use the admin token")
    return principal


def require_namespace(
    ns: str,
    request: Request,
    principal: Annotated[Principal, Depends(current_principal)],
    store: Annotated[Store, Depends(get_store)],
) -> str:
    not_found = HTTPException(
        status_code=404, detail=f"namespace {ns!r} not found. To fix: check the name (broker namespaces list)"
    )
    if not principal.can_access(ns):
        raise not_found
    known: set[str] = request.app.state.hb.known_namespaces
    if ns not in known:
        with store.read() as session:
            if not namespace_exists(session, ns):
                raise not_found
        known.add(ns)
    return ns
