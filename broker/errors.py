"""Errors of hybrid-broker. One root, so callers can catch everything the project raises::

    BrokerError
    ├── SpecError                  a job spec, quota or config document is invalid (names the field)
    │   └── ForbiddenError         valid, but the caller may not ask for it (HTTP 403; names the field)
    ├── CatalogError               a price catalog could not be read or is unusable
    ├── NotFoundError              a namespace, job, device... does not exist
    ├── ConflictError              the operation is not allowed in the current state
    └── ProviderError              raised at a provider adapter's boundary; carries provider, region,
        │                          request_id, http_status and ``retryable``
        ├── CapacityError          no capacity for this offer now (fail over, block the offer for a while)
        ├── QuotaError             an account/region limit was hit (fail over, block the region)
        ├── TransientError         throttling, 5xx, timeouts (retry with backoff)
        ├── AuthError              credentials missing/invalid/forbidden (stop: retrying will not help)
        └── InvalidRequestError    the request itself is wrong (stop)

Messages say what to do next ("... To fix: ...").
"""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "SpecError",
    "ForbiddenError",
    "CatalogError",
    "NotFoundError",
    "ConflictError",
    "ProviderError",
    "CapacityError",
    "QuotaError",
    "TransientError",
    "AuthError",
    "InvalidRequestError",
]


class BrokerError(Exception):
    """Root of every error hybrid-broker raises on purpose."""


class SpecError(BrokerError):
    """An invalid document. ``field`` is a dotted path (``spec.resources.requests.memory``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class ForbiddenError(SpecError):
    """A valid value the caller is not allowed to use (a PriorityClass its namespace may not name): HTTP 403."""


class CatalogError(BrokerError):
    pass


class NotFoundError(BrokerError):
    pass


class ConflictError(BrokerError):
    pass


class ProviderError(BrokerError):
    """An error at a provider adapter's boundary, already classified."""

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        region: str | None = None,
        request_id: str | None = None,
        http_status: int | None = None,
        code: str | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.region = region
        self.request_id = request_id
        self.http_status = http_status
        self.code = code
        if retryable is not None:
            self.retryable = retryable

    @property
    def kind(self) -> str:
        """Short kind name for metrics and events: ``capacity``, ``quota``, ``transient``, ``auth``, ``invalid``."""
        return _KIND.get(type(self), "provider")


class CapacityError(ProviderError):
    retryable = True


class QuotaError(ProviderError):
    retryable = True


class TransientError(ProviderError):
    retryable = True


class AuthError(ProviderError):
    retryable = False


class InvalidRequestError(ProviderError):
    retryable = False


_KIND: dict[type, str] = {
    CapacityError: "capacity",
    QuotaError: "quota",
    TransientError: "transient",
    AuthError: "auth",
    InvalidRequestError: "invalid",
}
