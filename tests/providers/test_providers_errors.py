"""Every expected SDK error maps to the right typed error, carrying provider, region, request id, status."""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import google.auth.exceptions as gauth_exc
import httpx
import libcloud.common.exceptions as lc_http
import libcloud.common.google as lc_google
import libcloud.common.types as lc_types
import pytest
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ODataV4Format, ServiceRequestError

from broker.errors import (
    AuthError,
    CapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaError,
    TransientError,
)
from providers.errors import map_errors


def boto(code: str, status: int = 400) -> Exception:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": f"{code} happened"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "RunInstances",
    )


def azure(code: str | None, status: int) -> Exception:
    exc = HttpResponseError(message=f"{code} happened")
    exc.status_code = status
    if code:
        exc.error = ODataV4Format({"error": {"code": code, "message": f"{code} happened"}})
    return exc


def httpx_status(status: int, body: dict[str, Any] | None = None) -> Exception:
    req = httpx.Request("GET", "https://example.invalid/x")
    resp = httpx.Response(status, json=body or {}, request=req)
    return httpx.HTTPStatusError(f"{status}", request=req, response=resp)


CASES: list[tuple[str, Exception, type[ProviderError], int | None]] = [
    ("aws InsufficientInstanceCapacity is a capacity error", boto("InsufficientInstanceCapacity", 500),
     CapacityError, 500),
    ("aws InsufficientHostCapacity is a capacity error", boto("InsufficientHostCapacity"), CapacityError, 400),
    ("aws SpotMaxPriceTooLow is a capacity error", boto("SpotMaxPriceTooLow"), CapacityError, 400),
    ("aws InstanceLimitExceeded is a quota error", boto("InstanceLimitExceeded"), QuotaError, 400),
    ("aws VcpuLimitExceeded is a quota error", boto("VcpuLimitExceeded"), QuotaError, 400),
    ("aws MaxSpotInstanceCountExceeded is a quota error", boto("MaxSpotInstanceCountExceeded"), QuotaError, 400),
    ("aws RequestLimitExceeded is transient", boto("RequestLimitExceeded", 503), TransientError, 503),
    ("aws Throttling is transient", boto("Throttling"), TransientError, 400),
    ("aws ThrottlingException is transient", boto("ThrottlingException"), TransientError, 400),
    ("aws an unknown 5xx code is transient", boto("SomethingNew", 502), TransientError, 502),
    ("aws UnauthorizedOperation is auth", boto("UnauthorizedOperation", 403), AuthError, 403),
    ("aws AuthFailure is auth", boto("AuthFailure", 401), AuthError, 401),
    ("aws InvalidParameterValue is invalid", boto("InvalidParameterValue"), InvalidRequestError, 400),
    ("aws InvalidAMIID.NotFound is invalid", boto("InvalidAMIID.NotFound"), InvalidRequestError, 400),
    ("aws no credentials is auth", botocore.exceptions.NoCredentialsError(), AuthError, None),
    ("aws endpoint unreachable is transient",
     botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), TransientError, None),
    ("azure SkuNotAvailable is a capacity error", azure("SkuNotAvailable", 409), CapacityError, 409),
    ("azure AllocationFailed is a capacity error", azure("AllocationFailed", 409), CapacityError, 409),
    ("azure ZonalAllocationFailed is a capacity error", azure("ZonalAllocationFailed", 409), CapacityError, 409),
    ("azure OperationNotAllowed (core quota) is a quota error", azure("OperationNotAllowed", 409), QuotaError, 409),
    ("azure QuotaExceeded is a quota error", azure("QuotaExceeded", 409), QuotaError, 409),
    ("azure a bare 429 is transient", azure(None, 429), TransientError, 429),
    ("azure a bare 503 is transient", azure(None, 503), TransientError, 503),
    ("azure a bare 401 is auth", azure(None, 401), AuthError, 401),
    ("azure a bare 403 is auth", azure(None, 403), AuthError, 403),
    ("azure AuthorizationFailed is auth", azure("AuthorizationFailed", 403), AuthError, 403),
    ("azure InvalidParameter is invalid", azure("InvalidParameter", 400), InvalidRequestError, 400),
    ("azure ClientAuthenticationError is auth", ClientAuthenticationError("no token"), AuthError, None),
    ("azure a connection failure is transient", ServiceRequestError("refused"), TransientError, None),
    ("libcloud an EC2 capacity message is a capacity error",
     lc_http.BaseHTTPError(500, "InsufficientInstanceCapacity: none left"), CapacityError, 500),
    ("libcloud an EC2 quota message is a quota error",
     lc_http.BaseHTTPError(400, "VcpuLimitExceeded: too many"), QuotaError, 400),
    ("libcloud RateLimitReachedError is transient", lc_http.RateLimitReachedError(headers={}), TransientError, 429),
    ("libcloud InvalidCredsError is auth", lc_types.InvalidCredsError("AuthFailure: bad key"), AuthError, 401),
    ("libcloud ServiceUnavailableError is transient", lc_types.ServiceUnavailableError("down"), TransientError, 503),
    ("libcloud GCE pool exhausted is a capacity error",
     lc_google.GoogleBaseError("no room", 503, "ZONE_RESOURCE_POOL_EXHAUSTED"), CapacityError, 503),
    ("libcloud GCE QuotaExceededError is a quota error",
     lc_google.QuotaExceededError("CPUS", 403, "QUOTA_EXCEEDED"), QuotaError, 403),
    ("libcloud GCE rateLimitExceeded is transient",
     lc_google.GoogleBaseError("slow down", 403, "rateLimitExceeded"), TransientError, 403),
    ("libcloud GoogleAuthError is auth", lc_google.GoogleAuthError("expired"), AuthError, None),
    ("google-auth an STS refusal (OAuthError) is auth",
     gauth_exc.OAuthError("Error code invalid_grant: The provided subject token is not valid"), AuthError, None),
    ("google-auth a retryable refresh error is transient",
     gauth_exc.RefreshError("backend", retryable=True), TransientError, None),
    ("google-auth a transport error is transient", gauth_exc.TransportError("connection reset"), TransientError,
     None),
    ("httpx 429 is transient", httpx_status(429), TransientError, 429),
    ("httpx 500 is transient", httpx_status(500), TransientError, 500),
    ("httpx 403 is auth", httpx_status(403), AuthError, 403),
    ("httpx 404 is invalid", httpx_status(404), InvalidRequestError, 404),
    ("httpx an ARM body code beats the status",
     httpx_status(409, {"error": {"code": "SkuNotAvailable", "message": "m"}}), CapacityError, 409),
    ("httpx a connect failure is transient", httpx.ConnectError("refused"), TransientError, None),
    ("httpx a read timeout is transient", httpx.ReadTimeout("slow"), TransientError, None),
]


@pytest.mark.parametrize(("raw", "expected", "status"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_sdk_error_maps_to_its_typed_error(
    raw: Exception, expected: type[ProviderError], status: int | None
) -> None:
    with pytest.raises(ProviderError) as info:
        with map_errors("cloudx", "region-1", "req-9"):
            raise raw
    err = info.value
    assert type(err) is expected
    assert err.__cause__ is raw
    assert (err.provider, err.region, err.request_id) == ("cloudx", "region-1", "req-9")
    assert err.http_status == status
    assert err.retryable == (expected in (CapacityError, QuotaError, TransientError))
    assert "To fix:" in str(err)


def test_a_bug_that_is_no_sdk_error_propagates_unchanged() -> None:
    with pytest.raises(KeyError):
        with map_errors("aws", "us-east-1"):
            raise KeyError("bug")


def test_an_already_typed_error_gets_missing_context_filled_in() -> None:
    with pytest.raises(CapacityError) as info:
        with map_errors("aws", "us-east-1", "r1"):
            raise CapacityError("full")
    assert (info.value.provider, info.value.region, info.value.request_id) == ("aws", "us-east-1", "r1")


def test_the_code_of_the_provider_is_kept_on_the_error() -> None:
    with pytest.raises(QuotaError) as info:
        with map_errors("aws"):
            raise boto("VcpuLimitExceeded")
    assert info.value.code == "VcpuLimitExceeded"
    assert info.value.kind == "quota"


RETRY_AFTER_CASES = [
    ("delta-seconds", "30", 30.0),
    ("an HTTP date in the past is zero", "Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ("garbage is ignored", "soon", None),
]


@pytest.mark.parametrize(("value", "want"), [c[1:] for c in RETRY_AFTER_CASES], ids=[c[0] for c in RETRY_AFTER_CASES])
def test_retry_after_is_read_from_an_httpx_error(value: str, want: float | None) -> None:
    import httpx

    from providers.errors import map_exception

    req = httpx.Request("GET", "https://127.0.0.1/x")
    resp = httpx.Response(429, headers={"Retry-After": value}, request=req)
    mapped = map_exception(httpx.HTTPStatusError("429", request=req, response=resp), "azure", "eastus")
    assert isinstance(mapped, TransientError) and mapped.retry_after == want  # type: ignore[attr-defined]


def test_retry_after_is_read_from_a_botocore_error() -> None:
    from botocore.exceptions import ClientError

    from providers.errors import map_exception

    exc = ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"},
                       "ResponseMetadata": {"HTTPStatusCode": 503, "HTTPHeaders": {"retry-after": "7"}}},
                      "RunInstances")
    mapped = map_exception(exc, "aws", "us-east-1")
    assert isinstance(mapped, TransientError) and mapped.retry_after == 7.0  # type: ignore[attr-defined]
