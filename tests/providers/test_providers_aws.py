"""AWS adapter against moto in server mode, through a fault-injecting proxy that speaks EC2's own errors."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import boto3
import pytest

from broker.clock import ManualClock
from broker.errors import AuthError, CapacityError, CatalogError, TransientError
from broker.model import Capacity, InstanceState, RetryPolicy
from providers.aws import AwsProvider, parse_price_list
from providers.base import TAG_JOB, TAG_REQUEST, Provider
from providers.failover import provision

from .builders import make_option
from .faultproxy import FaultProxy, ec2_action, ec2_error, throttle

pytestmark = pytest.mark.network
REGIONS = ["us-east-1", "eu-west-1"]

DEFAULT_RETRY = RetryPolicy()


@pytest.fixture
def aws(ec2_faults: FaultProxy, fixture_http: str) -> Iterator[AwsProvider]:
    yield AwsProvider(REGIONS, endpoint_url=ec2_faults.url, access_key="testing", secret_key="testing",
                      price_list_url=fixture_http + "/aws/{region}.json")


def live_in_moto(moto_endpoint: str, request_id: str) -> list[str]:
    """Instances tagged with ``request_id`` that are not terminated, asked of moto directly (no proxy)."""
    out = []
    for region in REGIONS:
        ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name=region,
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        res = ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_REQUEST}", "Values": [request_id]}])
        out += [i["InstanceId"] for r in res["Reservations"] for i in r["Instances"]
                if i["State"]["Name"] not in ("terminated", "shutting-down")]
    return out


def test_offers_join_moto_shapes_with_price_list_prices_and_drop_fake_spot_prices(aws: AwsProvider) -> None:
    aws.regions = ["us-east-1"]
    offers = aws.offers()
    by_type = {o.instance_type.name: o for o in offers if o.capacity is Capacity.ON_DEMAND}
    assert sorted(by_type) == ["c5.xlarge", "g5.xlarge", "m5.large", "t3.micro"]
    m5 = by_type["m5.large"]
    assert (m5.instance_type.vcpus, m5.instance_type.memory_gib, m5.hourly_usd) == (2, 8, 0.096)
    g5 = by_type["g5.xlarge"].instance_type
    assert (g5.gpus, g5.accelerator) == (1, "A10G")
    assert [o for o in offers if o.capacity is Capacity.SPOT] == []  # moto's 0.00001 is an outlier
    [prov] = aws.last_provenance
    assert prov.outliers == 4 and prov.offers == 4 and prov.date.startswith("2026-11-01")


def test_the_price_list_parser_keeps_only_shared_linux_used_capacity(fixture_http: str) -> None:
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).parent / "fixtures/aws/us-east-1.json").read_text())
    assert parse_price_list(doc, "us-east-1") == {
        "m5.large": 0.096, "c5.xlarge": 0.17, "g5.xlarge": 1.006, "t3.micro": 0.0104}
    assert parse_price_list(doc, "eu-west-1") == {}
    with pytest.raises(CatalogError, match="To fix"):
        parse_price_list({"products": {}}, "us-east-1")


def test_round_trip_launch_list_terminate(aws: AwsProvider, moto_endpoint: str) -> None:
    assert isinstance(aws, Provider)
    req = f"req-{uuid.uuid4().hex[:8]}"
    offer = next(o for o in aws.offers() if o.instance_type.name == "m5.large" and o.region == "eu-west-1")
    made = aws.launch(offer, 2, req, tags={TAG_JOB: "job-rt"})
    assert len(made) == 2 and {i.region for i in made} == {"eu-west-1"}
    assert all(i.instance_type == "m5.large" and i.tags[TAG_REQUEST] == req for i in made)
    again = aws.launch(offer, 2, req, tags={TAG_JOB: "job-rt"})
    assert sorted(i.id for i in again) == sorted(i.id for i in made)  # idempotent per request id
    listed = aws.instances({TAG_JOB: "job-rt"})
    assert sorted(i.id for i in listed) == sorted(i.id for i in made)
    assert {i.state for i in listed} <= {InstanceState.PENDING, InstanceState.RUNNING}
    assert sorted(live_in_moto(moto_endpoint, req)) == sorted(i.id for i in made)
    aws.terminate([i.id for i in made], req)
    assert live_in_moto(moto_endpoint, req) == []
    assert {i.state for i in aws.instances({TAG_JOB: "job-rt"})} == {InstanceState.TERMINATED}


def _provision(aws: AwsProvider, options, retry=DEFAULT_RETRY, clock=None):
    req = f"req-{uuid.uuid4().hex[:8]}"
    clock = clock or ManualClock()
    out = provision(options, lambda name: aws, request_id=req, tags={TAG_JOB: "job-f"}, job=None,
                    retry=retry, clock=clock, rng=random.Random(1))
    return out, req, clock


US = make_option("aws", "us-east-1", "m5.large", 0.096)
EU = make_option("aws", "eu-west-1", "m5.large", 0.1056)


def test_capacity_error_fails_over_to_the_next_region(aws: AwsProvider, ec2_faults: FaultProxy,
                                                      moto_endpoint: str) -> None:
    fault = ec2_faults.add(ec2_action("RunInstances"), ec2_error("InsufficientInstanceCapacity", status=500))
    out, req, _ = _provision(aws, [US, EU])
    assert fault.hits == 1
    assert [a.outcome for a in out.attempts] == ["capacity", "launched"]
    assert out.ok and out.option == EU and out.instances[0].region == "eu-west-1"
    assert live_in_moto(moto_endpoint, req) == [out.instances[0].id]
    aws.terminate([i.id for i in out.instances], req)


def test_throttling_backs_off_on_the_clock_then_succeeds(aws: AwsProvider, ec2_faults: FaultProxy,
                                                         moto_endpoint: str) -> None:
    ec2_faults.add(ec2_action("RunInstances"), throttle(json_body=False), times=2)
    out, req, clock = _provision(aws, [US], retry=RetryPolicy(6, 10, 120))
    assert [a.outcome for a in out.attempts] == ["transient", "transient", "launched"]
    assert len(clock.sleeps) == 2 and 5 <= clock.sleeps[0] <= 10 and 10 <= clock.sleeps[1] <= 20
    aws.terminate([i.id for i in out.instances], req)
    assert live_in_moto(moto_endpoint, req) == []


def test_gives_up_after_the_backoff_limit_and_leaves_nothing(aws: AwsProvider, ec2_faults: FaultProxy,
                                                             moto_endpoint: str) -> None:
    ec2_faults.add(ec2_action("RunInstances"), ec2_error("RequestLimitExceeded", status=503), times=-1)
    out, req, clock = _provision(aws, [US, EU], retry=RetryPolicy(2, 1, 4))
    assert isinstance(out.error, TransientError) and out.error.code == "RequestLimitExceeded"
    # the backoff limit is per option: both regions got their retries before the call gave up
    assert [a.region for a in out.attempts] == [US.region] * 3 + [EU.region] * 3
    assert len(clock.sleeps) == 4 and live_in_moto(moto_endpoint, req) == []


def test_auth_failure_stops_at_once(aws: AwsProvider, ec2_faults: FaultProxy) -> None:
    ec2_faults.add(ec2_action("RunInstances"), ec2_error("UnauthorizedOperation", status=403))
    out, _, clock = _provision(aws, [US, EU])
    assert isinstance(out.error, AuthError) and [a.outcome for a in out.attempts] == ["auth"]
    assert clock.sleeps == []


def test_quota_error_blocks_the_region_and_fails_over(aws: AwsProvider, ec2_faults: FaultProxy,
                                                      moto_endpoint: str) -> None:
    ec2_faults.add(ec2_action("RunInstances"), ec2_error("VcpuLimitExceeded"))
    us_c5 = make_option("aws", "us-east-1", "c5.xlarge", 0.17)
    out, req, _ = _provision(aws, [US, us_c5, EU])
    assert [a.outcome for a in out.attempts] == ["quota", "skipped", "launched"]
    aws.terminate([i.id for i in out.instances], req)
    assert live_in_moto(moto_endpoint, req) == []


def test_a_launch_that_succeeded_behind_an_error_is_cleaned_up_by_tag(
    aws: AwsProvider, ec2_faults: FaultProxy, moto_endpoint: str
) -> None:
    # The RunInstances call reaches moto (instances exist) but the client sees a capacity error.
    ec2_faults.add(ec2_action("RunInstances"), ec2_error("InsufficientInstanceCapacity", status=500),
                   times=-1, passthrough=True)
    out, req, _ = _provision(aws, [US, EU])
    assert isinstance(out.error, CapacityError)
    assert live_in_moto(moto_endpoint, req) == []
    assert any(c.action == "TerminateInstances" for c in ec2_faults.calls)


def test_a_spot_offer_pins_the_zone_whose_price_it_carries(aws: AwsProvider, ec2_faults: FaultProxy) -> None:
    from .faultproxy import ec2_response

    rows = "".join(
        f"<item><instanceType>m5.large</instanceType><productDescription>Linux/UNIX</productDescription>"
        f"<spotPrice>{usd}</spotPrice><timestamp>2026-12-01T00:00:00.000Z</timestamp>"
        f"<availabilityZone>{zone}</availabilityZone></item>"
        for zone, usd in (("us-east-1a", "0.041"), ("us-east-1c", "0.035"), ("us-east-1b", "0.038")))
    ec2_faults.add(ec2_action("DescribeSpotPriceHistory"),
                   ec2_response("DescribeSpotPriceHistory", f"<spotPriceHistorySet>{rows}</spotPriceHistorySet>"))
    aws.regions = ["us-east-1"]
    [spot] = [o for o in aws.offers() if o.capacity is Capacity.SPOT]
    assert (spot.instance_type.name, spot.hourly_usd, spot.location.zone) == ("m5.large", 0.035, "us-east-1c")
    req = f"req-{uuid.uuid4().hex[:8]}"
    [inst] = aws.launch(spot, 1, req, tags={TAG_JOB: "spot-zone"})
    assert inst.zone == "us-east-1c"  # launched where it was priced
    aws.terminate([inst.id], req)
