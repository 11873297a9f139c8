"""Map every SDK error to the typed errors of :mod:`broker.errors` at the adapter boundary.

One context manager, :func:`map_errors`, used around every SDK call::

    with map_errors("aws", region, request_id):
        ec2.run_instances(...)

It recognises botocore ``ClientError`` codes (and connection/credential errors), azure-core
``HttpResponseError`` (by ARM error code, then HTTP status), google-auth refresh/transport errors, libcloud
exceptions (typed classes, then the ``Code: message`` text its EC2 driver raises) and httpx errors. The
**most specific match wins**: an error code beats an HTTP status, which beats the exception class. It raises
``Mapped(msg) from exc`` carrying provider, region, request id, HTTP status, the provider's code and
``retryable``.

SDKs are imported lazily and only if already loaded, so this module works without boto3 or Azure.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from broker.errors import (
    AuthError,
    CapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaError,
    TransientError,
)

__all__ = ["map_errors", "map_exception", "retry_after_of", "CODE_MAP", "classify_status"]

# Provider error codes (AWS EC2, Azure ARM, GCP) -> class. Matched case-sensitively first, then lowercased.
CODE_MAP: dict[str, type[ProviderError]] = {
    # AWS EC2: capacity
    "InsufficientInstanceCapacity": CapacityError,
    "InsufficientHostCapacity": CapacityError,
    "InsufficientReservedInstanceCapacity": CapacityError,
    "InsufficientCapacity": CapacityError,
    "SpotMaxPriceTooLow": CapacityError,
    "Unsupported": CapacityError,  # "instance type not supported in this AZ now"
    # AWS EC2: quota
    "InstanceLimitExceeded": QuotaError,
    "VcpuLimitExceeded": QuotaError,
    "MaxSpotInstanceCountExceeded": QuotaError,
    "PendingVerification": QuotaError,
    # AWS: transient
    "RequestLimitExceeded": TransientError,
    "Throttling": TransientError,
    "ThrottlingException": TransientError,
    "TooManyRequestsException": TransientError,
    "ServiceUnavailable": TransientError,
    "Unavailable": TransientError,
    "InternalError": TransientError,
    "InternalFailure": TransientError,
    "RequestTimeout": TransientError,
    # AWS: auth
    "UnauthorizedOperation": AuthError,
    "AuthFailure": AuthError,
    "InvalidClientTokenId": AuthError,
    "SignatureDoesNotMatch": AuthError,
    "OptInRequired": AuthError,
    "ExpiredToken": AuthError,
    "AccessDenied": AuthError,
    "AccessDeniedException": AuthError,
    # AWS: invalid
    "InvalidParameterValue": InvalidRequestError,
    "InvalidParameterCombination": InvalidRequestError,
    "InvalidParameter": InvalidRequestError,
    "InvalidInstanceType": InvalidRequestError,
    "InvalidAMIID.NotFound": InvalidRequestError,
    "InvalidAMIID.Malformed": InvalidRequestError,
    "InvalidInstanceID.NotFound": InvalidRequestError,
    "InvalidInstanceID.Malformed": InvalidRequestError,
    "MissingParameter": InvalidRequestError,
    "IdempotentParameterMismatch": InvalidRequestError,
    # Azure ARM: capacity
    "SkuNotAvailable": CapacityError,
    "AllocationFailed": CapacityError,
    "ZonalAllocationFailed": CapacityError,
    "OverconstrainedAllocationRequest": CapacityError,
    "OverconstrainedZonalAllocationRequest": CapacityError,
    # Azure: quota
    "QuotaExceeded": QuotaError,
    "OperationNotAllowed": QuotaError,  # ARM reports core quota as OperationNotAllowed
    # Azure: transient
    "TooManyRequests": TransientError,
    "RetryableError": TransientError,
    "InternalServerError": TransientError,
    "ServerTimeout": TransientError,
    "GatewayTimeout": TransientError,
    # Azure: auth
    "AuthorizationFailed": AuthError,
    "AuthenticationFailed": AuthError,
    "InvalidAuthenticationToken": AuthError,
    "ExpiredAuthenticationToken": AuthError,
    "SubscriptionNotFound": AuthError,
    # Azure: invalid
    "InvalidTemplate": InvalidRequestError,
    "BadRequest": InvalidRequestError,
    "ResourceNotFound": InvalidRequestError,
    "NotFound": InvalidRequestError,
    # GCP (Compute Engine error reasons)
    "ZONE_RESOURCE_POOL_EXHAUSTED": CapacityError,
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": CapacityError,
    "QUOTA_EXCEEDED": QuotaError,
    "quotaExceeded": QuotaError,
    "rateLimitExceeded": TransientError,
    "userRateLimitExceeded": TransientError,
    "backendError": TransientError,
    "RESOURCE_NOT_FOUND": InvalidRequestError,
    "notFound": InvalidRequestError,
    "forbidden": AuthError,
    "PERMISSION_DENIED": AuthError,
    "UNAUTHENTICATED": AuthError,
}

_LOWER = {k.lower(): v for k, v in CODE_MAP.items()}

_HINT: dict[type[ProviderError], str] = {
    CapacityError: "To fix: try another zone, region, instance type or provider (the broker fails over).",
    QuotaError: "To fix: request a quota increase for this region, or place the job elsewhere.",
    TransientError: "To fix: nothing; retry later (the broker backs off and retries).",
    AuthError: "To fix: check this provider's credentials and permissions (`broker providers check`).",
    InvalidRequestError: "To fix: check the instance type, image and region of the request.",
    ProviderError: "To fix: see the provider's message above.",
}

_CODE_PREFIX = re.compile(r"^\s*(?:\d{3}\s+)?([A-Za-z][A-Za-z0-9_.]+):\s")


def classify_status(status: int | None) -> type[ProviderError] | None:
    """The error class an HTTP status alone implies (``None`` when it says nothing)."""
    if status is None:
        return None
    if status in (401, 403):
        return AuthError
    if status in (408, 409, 425, 429) or status >= 500:
        return TransientError
    if 400 <= status < 500:
        return InvalidRequestError
    return None


def _by_code(code: str | None) -> type[ProviderError] | None:
    if not code:
        return None
    return CODE_MAP.get(code) or _LOWER.get(code.lower())


def _mod(name: str) -> Any:
    """An SDK module if it is already imported (an exception of it can exist only then)."""
    return sys.modules.get(name)


def _classify(exc: BaseException) -> tuple[type[ProviderError] | None, str | None, int | None]:
    """(class, provider code, http status) for a raw SDK exception; class ``None`` = not an SDK error."""
    botocore_exc = _mod("botocore.exceptions")
    if botocore_exc is not None:
        if isinstance(exc, botocore_exc.ClientError):
            err = exc.response.get("Error", {}) or {}
            code = err.get("Code")
            status = (exc.response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode")
            return _by_code(code) or classify_status(status) or ProviderError, code, status
        if isinstance(exc, botocore_exc.NoCredentialsError | botocore_exc.PartialCredentialsError):
            return AuthError, "NoCredentials", None
        if isinstance(
            exc,
            botocore_exc.EndpointConnectionError
            | botocore_exc.ConnectTimeoutError
            | botocore_exc.ReadTimeoutError
            | botocore_exc.ConnectionClosedError,
        ):
            return TransientError, type(exc).__name__, None
        if isinstance(exc, botocore_exc.ParamValidationError):
            return InvalidRequestError, "ParamValidation", None

    azure_exc = _mod("azure.core.exceptions")
    if azure_exc is not None:
        if isinstance(exc, azure_exc.ClientAuthenticationError):
            status = getattr(getattr(exc, "response", None), "status_code", None)
            code = getattr(getattr(exc, "error", None), "code", None)
            return _by_code(code) or AuthError, code, status
        if isinstance(exc, azure_exc.HttpResponseError):
            status = getattr(exc, "status_code", None)
            code = getattr(getattr(exc, "error", None), "code", None)
            return _by_code(code) or classify_status(status) or ProviderError, code, status
        if isinstance(exc, azure_exc.ServiceRequestError | azure_exc.ServiceResponseError):
            return TransientError, type(exc).__name__, None
    azure_identity = _mod("azure.identity")
    if azure_identity is not None and isinstance(exc, azure_identity.CredentialUnavailableError):
        return AuthError, "CredentialUnavailable", None

    gauth_exc = _mod("google.auth.exceptions")  # google-auth: ADC / workload identity token refresh
    if gauth_exc is not None:
        if isinstance(exc, gauth_exc.RefreshError | gauth_exc.OAuthError):  # OAuthError: an STS/token refusal
            oauth = re.search(r"Error code (\w+)", str(exc))
            code = oauth.group(1) if oauth else type(exc).__name__
            return (TransientError if getattr(exc, "retryable", False) else AuthError), code, None
        if isinstance(exc, gauth_exc.TransportError):
            return TransientError, type(exc).__name__, None
        if isinstance(exc, gauth_exc.DefaultCredentialsError):
            return AuthError, "DefaultCredentials", None

    google_exc = _mod("libcloud.common.google")
    if google_exc is not None:
        if isinstance(exc, google_exc.GoogleAuthError):
            return AuthError, "GoogleAuthError", None
        if isinstance(exc, google_exc.QuotaExceededError):
            return QuotaError, getattr(exc, "code", None) or "QUOTA_EXCEEDED", getattr(exc, "http_code", None)
        if isinstance(exc, google_exc.GoogleBaseError):
            code = getattr(exc, "code", None)
            status = getattr(exc, "http_code", None)
            if isinstance(code, str):
                found = _by_code(code)
                if found:
                    return found, code, status
            return classify_status(status) or ProviderError, code if isinstance(code, str) else None, status

    lc_types = _mod("libcloud.common.types")
    lc_http = _mod("libcloud.common.exceptions")
    if lc_http is not None and isinstance(exc, lc_http.BaseHTTPError):
        code = _code_in_text(str(exc))
        status = exc.code if isinstance(exc.code, int) else None
        if isinstance(exc, lc_http.RateLimitReachedError):
            return _by_code(code) or TransientError, code or "RateLimitReached", 429
        return _by_code(code) or classify_status(status) or ProviderError, code, status
    if lc_types is not None:
        if isinstance(exc, lc_types.InvalidCredsError):
            return AuthError, _code_in_text(str(exc)) or "InvalidCreds", 401
        if isinstance(exc, lc_types.ServiceUnavailableError):
            return TransientError, "ServiceUnavailable", 503
        if isinstance(exc, lc_types.ProviderError):
            code = _code_in_text(str(exc))
            status = getattr(exc, "http_code", None)
            return _by_code(code) or classify_status(status) or ProviderError, code, status
        if isinstance(exc, lc_types.LibcloudError):
            code = _code_in_text(str(exc))
            return _by_code(code) or ProviderError, code, None

    httpx = _mod("httpx")
    if httpx is not None:
        if isinstance(exc, httpx.HTTPStatusError):
            status = exc.response.status_code
            code = _code_in_body(exc.response)
            return _by_code(code) or classify_status(status) or ProviderError, code, status
        if isinstance(exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError):
            return TransientError, type(exc).__name__, None

    if isinstance(exc, ConnectionError | TimeoutError):
        return TransientError, type(exc).__name__, None
    # libcloud's EC2 driver raises bare ``Exception("Code: message")`` for most API errors.
    if type(exc) is Exception:
        code = _code_in_text(str(exc))
        found = _by_code(code)
        if found:
            return found, code, None
    return None, None, None


def _code_in_text(text: str) -> str | None:
    m = _CODE_PREFIX.match(text)
    return m.group(1) if m else None


def _code_in_body(response: Any) -> str | None:
    """The ``error.code`` of an ARM/GCP JSON error body, if any."""
    try:
        body = response.json()
    except Exception:  # noqa: BLE001 - any non-JSON body simply has no code
        return None
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code = err.get("code")
        if isinstance(code, str):
            return code
        errors = err.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            reason = errors[0].get("reason")
            return reason if isinstance(reason, str) else None
    return None


def map_exception(
    exc: BaseException, provider: str, region: str | None = None, request_id: str | None = None
) -> ProviderError | None:
    """The typed error for ``exc`` (``None`` when ``exc`` is not an SDK/provider error). A ``ProviderError``
    is returned as is, with ``provider``/``region``/``request_id`` filled in when missing."""
    if isinstance(exc, ProviderError):
        exc.provider = exc.provider or provider
        exc.region = exc.region or region
        exc.request_id = exc.request_id or request_id
        return exc
    cls, code, status = _classify(exc)
    if cls is None:
        return None
    after = retry_after_of(exc)
    where = f"{provider}:{region}" if region else provider
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    msg = f"{where}: {cls.__name__.removesuffix('Error').lower() or 'provider'} error"
    msg += f" ({code})" if code else ""
    msg += f": {detail[:300]}. {_HINT.get(cls, _HINT[ProviderError])}"
    mapped = cls(msg, provider=provider, region=region, request_id=request_id, http_status=status, code=code)
    mapped.retry_after = after  # type: ignore[attr-defined]
    return mapped


def _parse_retry_after(value: Any) -> float | None:
    """Seconds from a ``Retry-After`` value: delta-seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if value is None:
        return None
    text = str(value).strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    from datetime import UTC, datetime
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def retry_after_of(exc: BaseException) -> float | None:
    """The ``Retry-After`` (seconds) a raw SDK error's HTTP response carried, else ``None``: botocore
    ``ResponseMetadata.HTTPHeaders``, azure-core / httpx ``response.headers``, libcloud ``headers``."""
    headers: Any = None
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        headers = (response.get("ResponseMetadata") or {}).get("HTTPHeaders")
    elif response is not None:
        headers = getattr(response, "headers", None)
    if headers is None:
        headers = getattr(exc, "headers", None)
    if not headers:
        return None
    try:
        value = headers.get("Retry-After") or headers.get("retry-after")
    except AttributeError:
        return None
    return _parse_retry_after(value)


@contextmanager
def map_errors(provider: str, region: str | None = None, request_id: str | None = None) -> Iterator[None]:
    """Run the body; re-raise any SDK error as the matching :class:`broker.errors.ProviderError` subclass
    (``raise Mapped(msg) from exc``). Errors that are not SDK errors (bugs) propagate unchanged."""
    try:
        yield
    except ProviderError as exc:
        map_exception(exc, provider, region, request_id)
        raise
    except Exception as exc:
        mapped = map_exception(exc, provider, region, request_id)
        if mapped is None:
            raise
        raise mapped from exc
