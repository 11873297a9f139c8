"""A small fault-injecting HTTP(S) reverse proxy for provider tests (real sockets on 127.0.0.1).

It forwards every request to ``upstream`` unchanged (Host header included, so emulators build URLs that
point back at the proxy) unless a :class:`Fault` matches: then it answers with the provider's own error
payload (:func:`ec2_error`, :func:`arm_error`, :func:`gce_error`, :func:`throttle`) or a canned success
(:func:`ec2_response`, :func:`ec2_console_output`) for the next ``times`` matching calls. ``calls`` records
``(method, path, action)`` of everything it saw.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    body: bytes

    @property
    def action(self) -> str:
        """The EC2 query-API ``Action`` (query string or form body), else ``""``."""
        if "Action" in self.query:
            return self.query["Action"][0]
        try:
            form = parse_qs(self.body.decode())
        except UnicodeDecodeError:
            return ""
        return form.get("Action", [""])[0]

    def param(self, name: str) -> str:
        """An EC2 query-API parameter (query string or form body), else ``""``."""
        if name in self.query:
            return self.query[name][0]
        try:
            form = parse_qs(self.body.decode())
        except UnicodeDecodeError:
            return ""
        return form.get(name, [""])[0]


@dataclass
class Fault:
    match: Callable[[Seen], bool]
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1  # -1: forever
    hits: int = 0
    passthrough: bool = False  # forward the call first (it takes effect), then answer with the error


def ec2_action(name: str) -> Callable[[Seen], bool]:
    return lambda s: s.action == name


def ec2_call(name: str, **params: str) -> Callable[[Seen], bool]:
    """Matches the EC2 action ``name`` whose parameters include every ``params`` item
    (``ec2_call("GetConsoleOutput", InstanceId="i-1")``)."""
    return lambda s: s.action == name and all(s.param(k) == v for k, v in params.items())


def request(method: str, path_contains: str) -> Callable[[Seen], bool]:
    return lambda s: s.method == method and path_contains.lower() in s.path.lower()


def ec2_error(code: str, message: str = "injected", status: int = 400) -> tuple[int, bytes, dict[str, str]]:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
        f"<Message>{message}</Message></Error></Errors><RequestID>fault-1</RequestID></Response>"
    )
    return status, body.encode(), {"Content-Type": "text/xml"}


def ec2_response(action: str, inner_xml: str) -> tuple[int, bytes, dict[str, str]]:
    """A canned HTTP 200 answer of the EC2 query API to ``action``: ``<{action}Response>`` around
    ``inner_xml`` (the result elements, as the EC2 API reference shows them)."""
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>canned-1</requestId>{inner_xml}</{action}Response>"
    )
    return 200, body.encode(), {"Content-Type": "text/xml"}


def ec2_console_output(instance_id: str, text: str) -> tuple[int, bytes, dict[str, str]]:
    """A ``GetConsoleOutput`` answer whose (base64, as the API sends it) output is ``text``."""
    out = base64.b64encode(text.encode()).decode()
    return ec2_response("GetConsoleOutput", f"<instanceId>{instance_id}</instanceId>"
                        f"<timestamp>2026-12-02T12:00:00.000Z</timestamp><output>{out}</output>")


def arm_error(code: str, message: str = "injected", status: int = 409) -> tuple[int, bytes, dict[str, str]]:
    body = json.dumps({"error": {"code": code, "message": message}})
    return status, body.encode(), {"Content-Type": "application/json"}


def gce_error(reason: str, message: str = "injected", status: int = 403) -> tuple[int, bytes, dict[str, str]]:
    body = json.dumps({"error": {"code": status, "message": message,
                                 "errors": [{"reason": reason, "message": message, "domain": "global"}]}})
    return status, body.encode(), {"Content-Type": "application/json"}


def throttle(retry_after: int = 1, json_body: bool = True) -> tuple[int, bytes, dict[str, str]]:
    if json_body:
        body = json.dumps({"error": {"code": "TooManyRequests", "message": "slow down"}}).encode()
        ctype = "application/json"
    else:
        body = ec2_error("RequestLimitExceeded", "Request limit exceeded.")[1]
        ctype = "text/xml"
    return 429 if json_body else 503, body, {"Content-Type": ctype, "Retry-After": str(retry_after)}


class FaultProxy:
    """Reverse proxy to ``upstream``; serves TLS when ``certfile``/``keyfile`` are given and trusts
    ``upstream_verify`` (a CA path, or False) towards the upstream."""

    def __init__(
        self,
        upstream: str,
        *,
        certfile: str | None = None,
        keyfile: str | None = None,
        upstream_verify: str | bool = True,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults: list[Fault] = []
        self.calls: list[Seen] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(verify=upstream_verify, timeout=30.0)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else every keep-alive response waits ~40 ms for a delayed ACK

            def log_message(self, *args: Any) -> None:
                return

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                seen = Seen(self.command, parts.path, parse_qs(parts.query), body)
                fault = proxy._take(seen)
                headers = {k: v.strip() for k, v in self.headers.items()
                           if k.lower() not in ("content-length", "connection", "transfer-encoding",
                                                "accept-encoding")}
                if fault is not None and not fault.passthrough:
                    self._reply(fault.status, fault.body, fault.headers)
                    return
                resp = proxy._client.request(self.command, proxy.upstream + self.path, headers=headers,
                                             content=body)
                if fault is not None:
                    self._reply(fault.status, fault.body, fault.headers)
                    return
                out = {k: v for k, v in resp.headers.items()
                       if k.lower() not in ("content-length", "connection", "transfer-encoding",
                                            "content-encoding")}
                self._reply(resp.status_code, resp.content, out)

            def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        scheme = "http"
        if certfile:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(certfile, keyfile)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.port = self._server.server_address[1]
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _take(self, seen: Seen) -> Fault | None:
        with self._lock:
            self.calls.append(seen)
            for f in self.faults:
                if f.times != 0 and f.match(seen):
                    f.hits += 1
                    if f.times > 0:
                        f.times -= 1
                    return f
        return None

    def add(
        self,
        match: Callable[[Seen], bool],
        reply: tuple[int, bytes, dict[str, str]],
        times: int = 1,
        *,
        passthrough: bool = False,
    ) -> Fault:
        status, body, headers = reply
        fault = Fault(match, status, body, headers, times, passthrough=passthrough)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.calls.clear()

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
