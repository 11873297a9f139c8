"""What a request answers when the store cannot: JSON 503 with ``Retry-After``, logged once per outage.

A database that is down, restarting or out of connections raises SQLAlchemy's ``OperationalError`` /
``InterfaceError`` (or a pool ``TimeoutError``) deep inside a route. Without a handler each such request
is a plain-text 500 with a traceback in the log; with :func:`install_store_error_handlers` it is::

    HTTP/1.1 503 Service Unavailable
    Retry-After: 5
    {"detail": "the store is unavailable (OperationalError); nothing was changed. To fix: retry ...",
     "retry_after_seconds": 5}

A statement cancelled by the server's ``statement_timeout`` (``broker.store.STATEMENT_TIMEOUT_MS``) is a
503 too, saying so. One warning (no traceback) is logged when an outage starts, then at most one per
:data:`LOG_EVERY_SECONDS` while it lasts, so a 10 s outage under load logs one line.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

__all__ = ["install_store_error_handlers", "RETRY_AFTER_SECONDS", "LOG_EVERY_SECONDS", "OutageLog"]

log = logging.getLogger("broker.store")

RETRY_AFTER_SECONDS = 5
LOG_EVERY_SECONDS = 60.0
_STORE_DOWN = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError, sa.exc.DisconnectionError)


class OutageLog:
    """Logs the first store error of an outage, then at most one line per ``every`` seconds."""

    def __init__(self, every: float = LOG_EVERY_SECONDS) -> None:
        self.every = every
        self._last = float("-inf")
        self._suppressed = 0
        self._lock = threading.Lock()

    def error(self, what: str) -> bool:
        """Note one failed request; True when it was logged."""
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.every:
                self._suppressed += 1
                return False
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        more = f" ({suppressed} more failed requests since the last line)" if suppressed else ""
        log.warning("the store is unavailable: %s; requests answer 503 with Retry-After%s", what, more)
        return True


def _timed_out(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", None)
    text = str(orig or "")
    return getattr(orig, "sqlstate", None) == "57014" or "statement timeout" in text or text == "interrupted"


def install_store_error_handlers(app: FastAPI) -> None:
    """Answer store outages (and cancelled statements) with JSON 503 + ``Retry-After`` on ``app``."""
    outage = OutageLog()
    app.state.store_outage_log = outage

    async def _store_down(_: Request, exc: Any) -> JSONResponse:
        kind = type(getattr(exc, "orig", None) or exc).__name__
        if _timed_out(exc):
            message = ("the query ran longer than the store's statement timeout and was cancelled. To fix: "
                       "narrow the request (fewer filters, a smaller page)")
        else:
            first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
            outage.error(f"{kind}: {first[:200]}")
            message = (f"the store is unavailable ({kind}); nothing was changed. To fix: retry after "
                       f"{RETRY_AFTER_SECONDS} s (the database may be restarting)")
        return JSONResponse({"detail": message, "retry_after_seconds": RETRY_AFTER_SECONDS}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    for cls in _STORE_DOWN:
        app.add_exception_handler(cls, _store_down)
