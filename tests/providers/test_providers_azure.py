"""Azure adapter: the real azure-mgmt-compute SDK and httpx against a local HTTPS fake of ARM and the
Retail Prices API, with a fault proxy in front that answers ARM's own error payloads."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest

from broker.clock import ManualClock
from broker.errors import AuthError, CapacityError
from broker.model import Capacity, InstanceState, RetryPolicy
from providers.azure import AzureProvider, accelerator_of, parse_retail_prices
from providers.base import TAG_JOB, TAG_REQUEST, Provider
from providers.failover import provision

from .builders import make_option
from .conftest import FakeCredential
from .fake_azure import price_rows
from .faultproxy import FaultProxy, arm_error, request, throttle

pytestmark = pytest.mark.network

DEFAULT_RETRY = RetryPolicy()


@pytest.fixture
def azure(arm_faults: FaultProxy, pki) -> Iterator[AzureProvider]:
    yield AzureProvider("sub-1", regions=["eastus", "westeurope"], credential=FakeCredential(),
                        base_url=arm_faults.url, connection_verify=pki.ca_cert,
                        prices_url=arm_faults.url + "/api/retail/prices")


def live_vms(azure_fake, request_id: str) -> list[str]:
    return [vm["name"] for vm in azure_fake.app.state.vms.values() if vm["tags"].get(TAG_REQUEST) == request_id]


def test_retail_price_rows_keep_linux_consumption_and_tell_spot_apart() -> None:
    ondemand, spot = parse_retail_prices(price_rows("eastus"))
    assert ondemand["Standard_D2s_v5"] == 0.096 and spot["Standard_D2s_v5"] == pytest.approx(0.0192)
    assert ondemand["Standard_NC4as_T4_v3"] == 0.526  # not the Windows (x1.96) nor dev/test (x0.9) row


def test_offers_follow_pages_and_drop_restricted_skus(azure: AzureProvider, arm_faults: FaultProxy) -> None:
    azure.regions = ["eastus"]
    offers = azure.offers()
    od = {o.instance_type.name: o for o in offers if o.capacity is Capacity.ON_DEMAND}
    assert sorted(od) == ["Standard_D2s_v5", "Standard_D4s_v5", "Standard_NC4as_T4_v3"]  # E2s restricted
    t4 = od["Standard_NC4as_T4_v3"].instance_type
    assert (t4.vcpus, t4.memory_gib, t4.gpus, t4.accelerator) == (4, 28, 1, "T4")
    assert {o.instance_type.name for o in offers if o.capacity is Capacity.SPOT} == set(od)
    price_pages = [c for c in arm_faults.calls if c.path == "/api/retail/prices"]
    assert len(price_pages) == 5  # 20 rows, 4 per page, followed through NextPageLink
    assert accelerator_of("Standard_ND96asr_A100_v4") == "A100"


def test_round_trip_launch_list_terminate(azure: AzureProvider, azure_fake) -> None:
    assert isinstance(azure, Provider)
    req = f"req-{uuid.uuid4().hex[:8]}"
    offer = next(o for o in azure.offers() if o.instance_type.name == "Standard_D2s_v5"
                 and o.region == "westeurope" and o.capacity is Capacity.SPOT)
    made = azure.launch(offer, 2, req, tags={TAG_JOB: "job-az"})
    assert len(made) == 2 and all(i.state is InstanceState.RUNNING for i in made)
    assert all(i.instance_type == "Standard_D2s_v5" and i.region == "westeurope" for i in made)
    vm = azure_fake.app.state.vms[("sub-1", "hybrid-broker", made[0].id)]
    assert vm["properties"]["priority"] == "Spot" and vm["tags"][TAG_JOB] == "job-az"
    assert sorted(i.id for i in azure.launch(offer, 2, req, tags={TAG_JOB: "job-az"})) == sorted(
        i.id for i in made)
    assert sorted(i.id for i in azure.instances({TAG_JOB: "job-az"})) == sorted(i.id for i in made)
    azure.terminate([i.id for i in made] + ["never-existed"], req)
    assert azure.instances({TAG_JOB: "job-az"}) == [] and live_vms(azure_fake, req) == []


EAST = make_option("azure", "eastus", "Standard_D2s_v5", 0.096)
WEST = make_option("azure", "westeurope", "Standard_D2s_v5", 0.1056)


def _provision(azure: AzureProvider, options, retry=DEFAULT_RETRY):
    req = f"req-{uuid.uuid4().hex[:8]}"
    clock = ManualClock()
    out = provision(options, lambda name: azure, request_id=req, tags={TAG_JOB: "job-f"}, job=None,
                    retry=retry, clock=clock, rng=random.Random(3))
    return out, req, clock


def test_sku_not_available_fails_over_to_the_next_region(azure: AzureProvider, arm_faults: FaultProxy,
                                                         azure_fake) -> None:
    arm_faults.add(request("PUT", "/virtualMachines/"), arm_error("SkuNotAvailable"))
    out, req, _ = _provision(azure, [EAST, WEST])
    assert [a.outcome for a in out.attempts] == ["capacity", "launched"]
    assert out.option == WEST and "SkuNotAvailable" in out.attempts[0].message
    azure.terminate([i.id for i in out.instances], req)
    assert live_vms(azure_fake, req) == []


def test_http_429_backs_off_then_succeeds(azure: AzureProvider, arm_faults: FaultProxy, azure_fake) -> None:
    arm_faults.add(request("PUT", "/virtualMachines/"), throttle(retry_after=30), times=3)
    out, req, clock = _provision(azure, [EAST], retry=RetryPolicy(6, 10, 120))
    assert [a.outcome for a in out.attempts] == ["transient"] * 3 + ["launched"]
    assert len(clock.sleeps) == 3 and all(a.retryable for a in out.attempts[:3])
    azure.terminate([i.id for i in out.instances], req)


def test_quota_then_auth_stops_and_leaves_nothing(azure: AzureProvider, arm_faults: FaultProxy,
                                                  azure_fake) -> None:
    arm_faults.add(request("PUT", "/virtualMachines/"), arm_error("OperationNotAllowed", "cores quota"))
    arm_faults.add(request("PUT", "/virtualMachines/"), arm_error("AuthorizationFailed", status=403))
    out, req, _ = _provision(azure, [EAST, WEST])
    assert [a.outcome for a in out.attempts] == ["quota", "auth"]
    assert isinstance(out.error, AuthError) and live_vms(azure_fake, req) == []


def test_a_vm_created_behind_an_error_is_deleted_on_abandon(azure: AzureProvider, arm_faults: FaultProxy,
                                                            azure_fake) -> None:
    arm_faults.add(request("PUT", "/virtualMachines/"), arm_error("AllocationFailed"), times=-1,
                   passthrough=True)
    out, req, _ = _provision(azure, [EAST, WEST])
    assert isinstance(out.error, CapacityError)
    assert live_vms(azure_fake, req) == []
    assert any(c.method == "DELETE" for c in arm_faults.calls)
