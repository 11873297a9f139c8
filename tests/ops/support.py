"""Helpers of the fleet-operations tests: a real HTTP webhook receiver on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """What the receiver got: ``requests`` as ``(headers, body bytes)``; answers ``fail_first`` times 503."""

    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.url = ""

    def payloads(self) -> list[Any]:
        return [json.loads(b) for _, b in self.requests]


@contextmanager
def webhook_receiver(fail_first: int = 0) -> Iterator[Receiver]:
    rec = Receiver(fail_first)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            rec.requests.append(({k: v for k, v in self.headers.items()}, body))
            code = 503 if len(rec.requests) <= rec.fail_first else 200
            self.send_response(code)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
