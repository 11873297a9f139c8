"""Liveness and readiness probes of running work, in the Kubernetes shape (stdlib only: the job spec
parser validates them at submission).

```yaml
spec:
  livenessProbe:
    exec: {command: [test, -f, healthy]}          # or httpGet: {port: 8080, path: /healthz, host: 127.0.0.1}
    initialDelaySeconds: 5                         # or tcpSocket: {port: 5432, host: 127.0.0.1}
    periodSeconds: 10
    timeoutSeconds: 1
    failureThreshold: 3
    successThreshold: 1
  readinessProbe: {...}
```

Semantics as in Kubernetes: the first probe runs ``initialDelaySeconds`` after the run started, then every
``periodSeconds``; a probe that does not answer within ``timeoutSeconds`` failed; ``failureThreshold``
consecutive failures make a liveness probe restart the job (readiness: not ready), ``successThreshold``
consecutive successes make it ready again. ``exec`` succeeds on exit code 0, ``httpGet`` on a status in
200..399, ``tcpSocket`` when the connection opens.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.errors import SpecError

__all__ = ["Probe", "ProbeResult", "parse_probe", "probes_of", "run_probe", "PROBE_KEYS"]

PROBE_KEYS = ("livenessProbe", "readinessProbe")
_KEYS = {"exec", "httpGet", "tcpSocket", "initialDelaySeconds", "periodSeconds", "timeoutSeconds",
         "failureThreshold", "successThreshold"}


@dataclass(frozen=True)
class Probe:
    kind: str  # exec | http | tcp
    command: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 0
    path: str = "/"
    scheme: str = "HTTP"
    initial_delay_seconds: float = 0.0
    period_seconds: float = 10.0
    timeout_seconds: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    message: str


def _num(d: Mapping[str, Any], key: str, where: str, default: float, lo: float, hi: float, integer: bool = False
         ) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or (integer and int(v) != v):
        raise SpecError(f"{where}.{key}", f"expected {'an integer' if integer else 'a number'}, got {v!r}")
    if not lo <= v <= hi:
        raise SpecError(f"{where}.{key}", f"{v} is out of range [{lo:g}, {hi:g}]")
    return float(v)


def _port(d: Mapping[str, Any], where: str) -> int:
    p = d.get("port")
    if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
        raise SpecError(f"{where}.port", f"expected a port number 1..65535, got {p!r}")
    return p


def _host(d: Mapping[str, Any], where: str) -> str:
    h = d.get("host", "127.0.0.1")
    if not isinstance(h, str) or not h or len(h) > 253 or any(c.isspace() for c in h):
        raise SpecError(f"{where}.host", f"expected a host name or address, got {h!r}")
    return h


def parse_probe(doc: Any, where: str) -> Probe:
    """One probe document -> :class:`Probe`; a SpecError names the field of any mistake."""
    if not isinstance(doc, Mapping):
        raise SpecError(where, "expected a mapping with one of exec, httpGet or tcpSocket")
    unknown = sorted(set(map(str, doc)) - _KEYS)
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}", f"unknown field. To fix: use one of {', '.join(sorted(_KEYS))}")
    handlers = [k for k in ("exec", "httpGet", "tcpSocket") if k in doc]
    if len(handlers) != 1:
        raise SpecError(where, "a probe needs exactly one of exec, httpGet or tcpSocket")
    timing = {
        "initial_delay_seconds": _num(doc, "initialDelaySeconds", where, 0, 0, 86400),
        "period_seconds": _num(doc, "periodSeconds", where, 10, 1, 86400),
        "timeout_seconds": _num(doc, "timeoutSeconds", where, 1, 0.05, 3600),
        "failure_threshold": int(_num(doc, "failureThreshold", where, 3, 1, 1000, integer=True)),
        "success_threshold": int(_num(doc, "successThreshold", where, 1, 1, 1000, integer=True)),
    }
    h = handlers[0]
    body = doc[h]
    w = f"{where}.{h}"
    if not isinstance(body, Mapping):
        raise SpecError(w, "expected a mapping")
    if h == "exec":
        cmd = body.get("command")
        if not isinstance(cmd, Sequence) or isinstance(cmd, str) or not cmd or not all(isinstance(c, str) for c in cmd):
            raise SpecError(f"{w}.command", "expected a non-empty list of strings")
        return Probe("exec", command=tuple(cmd), **timing)  # type: ignore[arg-type]
    if h == "httpGet":
        path = body.get("path", "/")
        if not isinstance(path, str) or not path.startswith("/"):
            raise SpecError(f"{w}.path", "expected a path starting with '/'")
        scheme = body.get("scheme", "HTTP")
        if scheme not in ("HTTP", "HTTPS"):
            raise SpecError(f"{w}.scheme", "use HTTP or HTTPS")
        return Probe("http", host=_host(body, w), port=_port(body, w), path=path, scheme=scheme,
                     **timing)  # type: ignore[arg-type]
    return Probe("tcp", host=_host(body, w), port=_port(body, w), **timing)  # type: ignore[arg-type]


def probes_of(spec_doc: Mapping[str, Any], where: str = "spec") -> dict[str, Probe]:
    """The probes of a job spec's ``spec`` mapping, by key (``livenessProbe``/``readinessProbe``)."""
    return {k: parse_probe(spec_doc[k], f"{where}.{k}") for k in PROBE_KEYS if spec_doc.get(k) is not None}


def run_probe(probe: Probe, *, cwd: str | None = None, env: Mapping[str, str] | None = None,
              as_user: tuple[int, int] | None = None) -> ProbeResult:
    """Run one probe now, bounded by its ``timeout_seconds``. ``exec`` runs in ``cwd`` with ``env`` (and as
    ``as_user`` = ``(uid, gid)`` when given: the edge agent runs a task's probe as the task's user)."""
    t = probe.timeout_seconds
    if probe.kind == "exec":
        ids: dict[str, Any] = {}
        if as_user is not None:
            ids = {"user": as_user[0], "group": as_user[1], "extra_groups": []}
        try:
            r = subprocess.run(list(probe.command), cwd=cwd, env=dict(env) if env is not None else None,
                               capture_output=True, timeout=t, stdin=subprocess.DEVNULL, **ids)
        except subprocess.TimeoutExpired:
            return ProbeResult(False, f"exec timed out after {t:g}s")
        except OSError as exc:
            return ProbeResult(False, f"exec failed: {exc}")
        return ProbeResult(r.returncode == 0, f"exit code {r.returncode}")
    if probe.kind == "http":
        cls = http.client.HTTPSConnection if probe.scheme == "HTTPS" else http.client.HTTPConnection
        conn = cls(probe.host, probe.port, timeout=t)
        try:
            conn.request("GET", probe.path, headers={"User-Agent": "hybrid-broker-probe"})
            status = conn.getresponse().status
        except (OSError, http.client.HTTPException) as exc:
            return ProbeResult(False, f"GET {probe.path}: {type(exc).__name__}: {exc}")
        finally:
            conn.close()
        return ProbeResult(200 <= status < 400, f"HTTP {status}")
    try:
        with socket.create_connection((probe.host, probe.port), timeout=t):
            return ProbeResult(True, "connected")
    except OSError as exc:
        return ProbeResult(False, f"tcp {probe.host}:{probe.port}: {exc}")
