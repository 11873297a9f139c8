"""An httpx client of the broker's HTTP API (what the ``broker`` CLI uses).

``BrokerClient()`` reads ``BROKER_URL`` (default ``http://127.0.0.1:8080``) and ``BROKER_TOKEN``. Every
method returns the decoded JSON answer or raises :class:`ApiError` (a :class:`~broker.errors.BrokerError`
whose message is the server's one-line ``detail``); a 422 raises :class:`~broker.errors.SpecError` with
the field path, so the CLI exits with code 2 for bad input.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

from broker.errors import BrokerError, SpecError

__all__ = ["BrokerClient", "ApiError", "DEFAULT_URL"]

DEFAULT_URL = "http://127.0.0.1:8080"


class ApiError(BrokerError):
    """The broker answered an error (``status``) or could not be reached (``status`` 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BrokerClient:
    """A thin client; ``retries`` re-sends idempotent requests (and keyed submissions) on connection errors."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = (url or os.environ.get("BROKER_URL") or DEFAULT_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("BROKER_TOKEN", "")
        self.retries = retries
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------------------------- plumbing

    def _request(self, method: str, path: str, *, retry: bool | None = None, **kwargs: Any) -> httpx.Response:
        may_retry = method in ("GET", "DELETE") if retry is None else retry
        attempts = self.retries + 1 if may_retry else 1
        for n in range(attempts):
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if n + 1 >= attempts:
                    raise ApiError(
                        0,
                        f"cannot reach the broker at {self.url} ({type(exc).__name__}). To fix: start it with "
                        "'broker serve' or set BROKER_URL",
                    ) from None
                time.sleep(min(2.0, 0.2 * 2**n))
                continue
            if response.status_code >= 400:
                raise self._error(response)
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _error(response: httpx.Response) -> BrokerError:
        try:
            body = response.json()
            detail = body.get("detail") if isinstance(body, dict) else None
            field = body.get("field") if isinstance(body, dict) else None
        except ValueError:
            detail, field = None, None
        if not isinstance(detail, str):
            fallback = response.text.strip()[:300] or response.reason_phrase
            detail = json.dumps(detail) if detail is not None else fallback
        if response.status_code == 422:
            return SpecError(field or "", detail.removeprefix(f"{field}: ") if field else detail)
        return ApiError(response.status_code, f"{detail} (HTTP {response.status_code})")

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # -------------------------------------------------------------------------------- policies

    def apply_policies(self, docs: list[Any]) -> dict[str, Any]:
        """Apply ResourceQuota / PriorityClass / Budget / Reservation documents, all or none (admin)."""
        return self._json("POST", "/v1/policies:apply", json={"items": docs})  # type: ignore[no-any-return]

    # -------------------------------------------------------------------------------- tenants

    def whoami(self) -> dict[str, Any]:
        return self._json("GET", "/v1/whoami")  # type: ignore[no-any-return]

    def create_namespace(self, name: str) -> dict[str, Any]:
        return self._json("POST", "/v1/namespaces", json={"name": name})  # type: ignore[no-any-return]

    def list_namespaces(self) -> list[dict[str, Any]]:
        return self._json("GET", "/v1/namespaces")["namespaces"]  # type: ignore[no-any-return]

    def create_token(self, namespace: str, description: str = "") -> dict[str, Any]:
        return self._json(  # type: ignore[no-any-return]
            "POST", f"/v1/namespaces/{namespace}/tokens", json={"description": description}
        )

    def list_tokens(self, namespace: str) -> list[dict[str, Any]]:
        return self._json("GET", f"/v1/namespaces/{namespace}/tokens")["tokens"]  # type: ignore[no-any-return]

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self._json("DELETE", f"/v1/tokens/{token_id}")  # type: ignore[no-any-return]

    # -------------------------------------------------------------------------------- jobs

    def submit(
        self,
        namespace: str,
        specs: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
    ) -> Any:
        """Submit one spec (-> the job) or a list (-> ``{"jobs": [...]}``). A key is generated when none is
        given, so retries after a connection error never duplicate jobs."""
        key = idempotency_key or uuid.uuid4().hex
        return self._json(
            "POST", f"/v1/namespaces/{namespace}/jobs", json=specs, headers={"Idempotency-Key": key}, retry=True
        )

    def list_jobs(
        self,
        namespace: str,
        *,
        states: Sequence[str] = (),
        labels: Sequence[str] = (),
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        params: list[tuple[str, str | int]] = [("limit", limit)]
        params += [("state", s) for s in states] + [("label", s) for s in labels]
        if cursor:
            params.append(("cursor", cursor))
        return self._json("GET", f"/v1/namespaces/{namespace}/jobs", params=params)  # type: ignore[no-any-return]

    def iter_jobs(self, namespace: str, *, states: Sequence[str] = (), labels: Sequence[str] = (),
                  page: int = 500) -> Iterator[dict[str, Any]]:
        """Every job of ``namespace`` matching the filters, following the cursor."""
        cursor: str | None = None
        while True:
            answer = self.list_jobs(namespace, states=states, labels=labels, limit=page, cursor=cursor)
            yield from answer["jobs"]
            cursor = answer.get("next_cursor")
            if not cursor:
                return

    def get_job(self, namespace: str, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/namespaces/{namespace}/jobs/{job_id}")  # type: ignore[no-any-return]

    def cancel_job(self, namespace: str, job_id: str) -> dict[str, Any]:
        return self._json("DELETE", f"/v1/namespaces/{namespace}/jobs/{job_id}")  # type: ignore[no-any-return]

    def logs(self, namespace: str, job_id: str, *, stream: str = "stdout") -> str:
        return self._request("GET", f"/v1/namespaces/{namespace}/jobs/{job_id}/logs",
                             params={"stream": stream}).text

    # -------------------------------------------------------------------------------- queues

    def get_queue(self, namespace: str | None = None) -> dict[str, Any]:
        """The queue of ``namespace`` (discipline, weight, usage, dominant share), or with None the
        cluster's (discipline across namespaces, half-life, every namespace's setting; admin)."""
        path = "/v1/queue" if namespace is None else f"/v1/namespaces/{namespace}/queue"
        return self._json("GET", path)  # type: ignore[no-any-return]

    def set_queue(
        self,
        namespace: str | None = None,
        *,
        discipline: str | None = None,
        weight: float | None = None,
        half_life_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Change the queue of ``namespace`` (or with None the cluster's; admin); arguments left None keep
        their value. Returns the queue as :meth:`get_queue` shows it."""
        body: dict[str, Any] = {}
        if discipline is not None:
            body["discipline"] = discipline
        if weight is not None:
            body["weight"] = weight
        if half_life_seconds is not None:
            body["halfLifeSeconds"] = half_life_seconds
        path = "/v1/queue" if namespace is None else f"/v1/namespaces/{namespace}/queue"
        return self._json("PUT", path, json=body, retry=True)  # type: ignore[no-any-return]

    def preview(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/v1/placements:preview", json=spec, retry=True)  # type: ignore[no-any-return]

    def offers(self, **filters: Any) -> dict[str, Any]:
        return self._json("GET", "/v1/catalog/offers", params=filters)  # type: ignore[no-any-return]

    def ready(self) -> bool:
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False
