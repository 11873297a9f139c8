"""A body-size limit on every route (issue 17): ``413`` with a JSON message before the body is buffered.

:class:`BodyLimitMiddleware` refuses a request whose ``Content-Length`` exceeds the limit without reading
it, and stops a chunked (or lying) body as soon as the bytes read pass the limit (it reads the body itself, at
most the limit, and hands it on in one piece). The limit is
``BROKER_MAX_BODY_BYTES`` (1 MiB by default); unauthenticated routes get a smaller one
(:data:`SMALL_LIMITS`: an edge enrollment is a CSR of a few KiB).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["BodyLimitMiddleware", "SMALL_LIMITS", "install_input_error_handlers"]

SMALL_LIMITS: dict[str, int] = {"/v1/edge/enroll": 64 * 1024}


def _replay(messages: list[Any], receive: Any) -> Any:
    async def replayed() -> Any:
        if messages:
            return messages.pop(0)
        return await receive()

    return replayed


class BodyLimitMiddleware:
    """ASGI middleware: at most ``max_bytes`` of request body per request (see the module docstring)."""

    def __init__(self, app: Any, max_bytes: int = 1_048_576) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = min(self.max_bytes, SMALL_LIMITS.get(scope.get("path", ""), self.max_bytes))
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await self._refuse(send, limit)
            return
        # Read the body here (at most ``limit`` bytes are ever held), then hand it to the app in one piece.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: let the app see it
                await self.app(scope, _replay([message], receive), send)
                return
            body = message.get("body", b"")
            seen += len(body)
            if seen > limit:
                await self._refuse(send, limit)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([first], receive), send)

    @staticmethod
    async def _refuse(send: Any, limit: int) -> None:
        body = json.dumps({"detail": f"request body exceeds {limit} bytes (or its Content-Length is not a "
                                     "number). To fix: send a smaller body, or raise BROKER_MAX_BODY_BYTES on "
                                     "the server"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def install_input_error_handlers(app: Any) -> None:
    """422 (JSON) instead of a 500 for input the parsers cannot hold: a document nested too deeply
    (``RecursionError`` in the JSON/YAML parser) or a number out of range (``OverflowError``, e.g.
    ``?since=99999999d``)."""
    from fastapi.responses import JSONResponse

    async def _too_deep(_: Any, exc: Exception) -> Any:
        return JSONResponse({"detail": "the request is nested too deeply to parse. To fix: flatten the document"},
                            status_code=422)

    async def _overflow(_: Any, exc: Exception) -> Any:
        return JSONResponse({"detail": f"a value in the request is out of range ({exc}). To fix: use a smaller "
                                       "value"}, status_code=422)

    app.add_exception_handler(RecursionError, _too_deep)
    app.add_exception_handler(OverflowError, _overflow)
