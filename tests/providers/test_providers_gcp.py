"""GCP adapter: the real Libcloud GCE driver and httpx against a local HTTPS fake of the Compute Engine API
and the Cloud Billing Catalog API, with a fault proxy in front that answers GCE's own error payloads."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.clock import ManualClock
from broker.errors import AuthError, CapacityError, QuotaError, TransientError
from broker.model import Capacity, Instance, InstanceState, InstanceType, Request, RetryPolicy, SpotPolicy
from providers import registry
from providers.base import TAG_JOB, TAG_REQUEST, Provider
from providers.failover import provision
from providers.gcp import (
    STARTUP_SCRIPT_KEY,
    TAGS_METADATA_KEY,
    BillingRates,
    GcpProvider,
    gce_label,
    parse_billing_skus,
    price_machine_type,
    split_gpu_type,
)
from providers.refresh import options_from_env, refresh_catalog

from .builders import make_job, make_offer, make_option, wait_ended
from .fake_gcp import RATES, billing_skus, operation_error
from .faultproxy import FaultProxy, Seen, gce_error, request

pytestmark = pytest.mark.network
PROJECT = "demo-proj"
ZONES = ["us-central1-a", "us-central1-b", "europe-west1-b"]
BROKER = [sys.executable, "-c", "from broker.cli import main; main()"]


@pytest.fixture
def gce_faults(gcp_proxy: FaultProxy, gcp_fake) -> Iterator[FaultProxy]:
    gcp_proxy.clear()
    gcp_fake.app.state.exhausted.clear()
    yield gcp_proxy
    gcp_proxy.clear()
    gcp_fake.app.state.exhausted.clear()


@pytest.fixture
def gcp(gce_faults: FaultProxy, gcp_creds: dict[str, str], pki) -> GcpProvider:
    return GcpProvider(PROJECT, zones=ZONES, credentials_file=gcp_creds["key"], endpoint=gce_faults.url,
                       billing_url=gce_faults.url, ca_bundle=pki.ca_cert, token_cache=gcp_creds["token"],
                       poll_interval_seconds=0)


def live(gcp_fake, request_id: str) -> list[str]:
    """Instances the fake holds for ``request_id`` (by its sanitized label), any state."""
    want = gce_label(request_id)
    return [f"{z}/{n}" for (z, n), i in gcp_fake.app.state.instances.items()
            if (i.get("labels") or {}).get(TAG_REQUEST) == want]


def operations_in(zone_prefix: str) -> Callable[[Seen], bool]:
    """Polls of GCE operations in zones starting with ``zone_prefix`` (the insert itself goes through)."""
    return lambda s: s.method == "GET" and f"/zones/{zone_prefix}" in s.path and "/operations/" in s.path


def new_request() -> str:
    return f"Req/{uuid.uuid4().hex[:8]}"  # upper case and '/' on purpose: not a valid GCE label value


# -- prices ------------------------------------------------------------------------------------------------

SKU_CASES = [
    ("an N2 core SKU is the n2 vCPU rate", "N2 Instance Core running in Americas", "CPU", "OnDemand", "h",
     ("core", "n2", Capacity.ON_DEMAND)),
    ("an N2D AMD RAM SKU is the n2d GiB rate, not n2's", "N2D AMD Instance Ram running in Americas", "RAM",
     "OnDemand", "GiBy.h", ("ram", "n2d", Capacity.ON_DEMAND)),
    ("an N1 predefined core SKU counts although its group is N1Standard",
     "N1 Predefined Instance Core running in Americas", "N1Standard", "OnDemand", "h",
     ("core", "n1", Capacity.ON_DEMAND)),
    ("a Spot Preemptible SKU is the spot rate", "Spot Preemptible N2 Instance Core running in Americas", "CPU",
     "Preemptible", "h", ("core", "n2", Capacity.SPOT)),
    ("C2's 'Compute optimized' description is the c2 family", "Compute optimized Core running in Americas",
     "CPU", "OnDemand", "h", ("core", "c2", Capacity.ON_DEMAND)),
    ("a Tesla T4 GPU SKU is the T4 rate", "Nvidia Tesla T4 GPU running in Americas", "GPU", "OnDemand", "h",
     ("gpu", "T4", Capacity.ON_DEMAND)),
    ("an A100 80GB GPU SKU is the A100-80GB rate", "Nvidia Tesla A100 80GB GPU running in Americas", "GPU",
     "OnDemand", "h", ("gpu", "A100-80GB", Capacity.ON_DEMAND)),
    ("a sole-tenancy premium is skipped", "N2 Sole Tenancy Instance Core running in Americas", "CPU",
     "OnDemand", "h", None),
    ("a custom machine core is skipped", "N2 Custom Instance Core running in Americas", "CPU", "OnDemand", "h",
     None),
    ("a 1-year commitment is skipped", "Commitment v1: N2 Cpu in Americas for 1 Year", "CPU", "Commit1Yr", "h",
     None),
    ("a RAM SKU priced per month is skipped", "N2 Instance Ram running in Americas", "RAM", "OnDemand",
     "GiBy.mo", None),
]


@pytest.mark.parametrize("desc,group,usage,unit,expect", [c[1:] for c in SKU_CASES],
                         ids=[c[0] for c in SKU_CASES])
def test_billing_skus_become_per_family_rates(desc: str, group: str, usage: str, unit: str,
                                             expect: tuple[str, str, Capacity] | None) -> None:
    from .fake_gcp import _sku

    rates = parse_billing_skus([_sku(desc, group, usage, ["us-central1", "us-east1"], unit, 0.031611)])
    tables = {"core": rates.core, "ram": rates.ram, "gpu": rates.gpu}
    if expect is None:
        assert (rates.rows, rates.skipped) == (0, 1) and not any(tables.values())
        return
    table, what, cap = expect
    assert tables[table] == {("us-central1", what, cap): 0.031611, ("us-east1", what, cap): 0.031611}
    assert rates.rows == 1 and sum(map(len, tables.values())) == 2


def test_machine_prices_compose_family_rates_gpus_and_shared_cores() -> None:
    rates = parse_billing_skus(billing_skus())
    od = Capacity.ON_DEMAND
    n2 = price_machine_type(rates, "us-central1", InstanceType("n2-standard-4", 4, 16), od)
    assert n2 == pytest.approx(4 * 0.031611 + 16 * 0.004237)  # 0.194236, libcloud's figure for it too
    n2d = price_machine_type(rates, "us-central1", InstanceType("n2d-standard-4", 4, 16), od)
    assert n2d == pytest.approx(4 * 0.027502 + 16 * 0.003686) and n2d != n2  # libcloud prices n2d as n2
    e2 = price_machine_type(rates, "us-central1", InstanceType("e2-small", 0.5, 2), od)
    assert e2 == pytest.approx(0.5 * 0.021811 + 2 * 0.002923)  # shared core: half a vCPU billed
    g2 = price_machine_type(rates, "us-central1", InstanceType("g2-standard-4", 4, 16, 1, "L4"), Capacity.SPOT)
    assert g2 == pytest.approx(4 * 0.00999 + 16 * 0.00117 + 0.2240)
    t4 = price_machine_type(rates, "europe-west1", InstanceType("n1-standard-4", 4, 15), od, extra_gpu=("T4", 2))
    assert t4 == pytest.approx(1.1 * (4 * 0.031611 + 15 * 0.004237 + 2 * 0.35))
    assert price_machine_type(rates, "asia-east1", InstanceType("n2-standard-4", 4, 16), od) is None
    assert price_machine_type(BillingRates({}, {}, {}), "us-central1", InstanceType("x-1", 1, 1), od) is None
    assert split_gpu_type("n1-standard-4+T4:2") == ("n1-standard-4", "T4", 2)
    assert split_gpu_type("n2-standard-4") == ("n2-standard-4", None, 0)


LABEL_CASES = [
    ("a valid label value is kept", "job-1_a", False, "job-1_a"),
    ("upper case is lowered and '/' becomes '_'", "Req/ABC", False, "req_abc"),
    ("a key that starts with a digit gets a letter in front", "9lives", True, "k9lives"),
    ("dots and spaces are replaced", "team.ml ops", False, "team_ml_ops"),
]


@pytest.mark.parametrize("value,key,expect", [c[1:] for c in LABEL_CASES], ids=[c[0] for c in LABEL_CASES])
def test_tags_become_valid_gce_labels(value: str, key: bool, expect: str) -> None:
    assert gce_label(value, key=key) == expect


def test_long_label_values_are_cut_to_63_and_stay_distinct() -> None:
    a, b = gce_label("x" * 100 + "a"), gce_label("x" * 100 + "b")
    assert len(a) == len(b) == 63 and a != b


# -- against the fake ----------------------------------------------------------------------------------------


def test_offers_page_through_machine_types_and_skus_and_tell_spot_apart(gcp: GcpProvider,
                                                                        gce_faults: FaultProxy) -> None:
    offers = gcp.offers()
    by = {(o.region, o.instance_type.name, o.capacity): o for o in offers}
    assert {o.region for o in offers} == {"us-central1", "europe-west1"}
    assert all(o.location.zone is None and o.location.continent in ("na", "eu") for o in offers)
    n2 = by[("us-central1", "n2-standard-4", Capacity.ON_DEMAND)]
    assert n2.hourly_usd == pytest.approx(0.194236)  # not the sole-tenancy or custom rates
    assert by[("us-central1", "n2-standard-4", Capacity.SPOT)].hourly_usd == pytest.approx(
        4 * 0.007594 + 16 * 0.001018)
    assert by[("europe-west1", "n2-standard-4", Capacity.ON_DEMAND)].hourly_usd == pytest.approx(1.1 * 0.194236)
    g2 = by[("us-central1", "g2-standard-4", Capacity.ON_DEMAND)].instance_type
    assert (g2.gpus, g2.accelerator, g2.gpu_memory_gib) == (1, "L4", 24.0)
    assert by[("us-central1", "e2-small", Capacity.ON_DEMAND)].instance_type.vcpus == 0.5
    t4 = {n for (r, n, c) in by if "+T4:" in n and c is Capacity.ON_DEMAND}
    assert {(r, n) for (r, n, c) in by if "+" in n} == {("us-central1", n) for n in t4}  # no T4 in europe
    assert t4 == {"n1-standard-4+T4:1", "n1-standard-4+T4:2", "n1-standard-4+T4:4"}
    pages = [c for c in gce_faults.calls if c.path.endswith("/zones/us-central1-a/machineTypes")]
    assert len(pages) == 3  # five types, two per page, followed through nextPageToken
    sku_pages = [c for c in gce_faults.calls if c.path.endswith("/skus")]
    assert len(sku_pages) == -(-len(billing_skus()) // 7) and sku_pages[1].query["pageToken"] == ["7"]
    [prov] = gcp.last_provenance
    assert prov.provider == "gcp" and prov.rows == 2 * 2 * len(RATES) and prov.offers == len(offers)


def test_round_trip_launch_list_terminate(gcp: GcpProvider, gcp_fake) -> None:
    assert isinstance(gcp, Provider)
    req = new_request()
    offer = next(o for o in gcp.offers() if o.instance_type.name == "n2-standard-4"
                 and o.region == "us-central1" and o.capacity is Capacity.SPOT)
    made = gcp.launch(offer, 2, req, tags={TAG_JOB: "Job/GCP 1"})
    assert len(made) == 2 and all(i.state is InstanceState.RUNNING for i in made)
    assert all(i.zone == "us-central1-a" and i.id.startswith("us-central1-a/hb-") for i in made)
    assert all(i.tags == {TAG_JOB: "Job/GCP 1", TAG_REQUEST: req} for i in made)  # original tags kept
    raw = gcp_fake.app.state.instances[tuple(made[0].id.split("/"))]
    assert raw["labels"] == {TAG_JOB: "job_gcp_1", TAG_REQUEST: gce_label(req)}
    assert raw["scheduling"]["provisioningModel"] == "SPOT" and "preemptible" not in raw["scheduling"]
    assert raw["scheduling"]["instanceTerminationAction"] == "STOP"  # stopped, seen, then deleted
    assert json.loads(raw["metadata"]["items"][0]["value"])[TAG_JOB] == "Job/GCP 1"
    assert raw["metadata"]["items"][0]["key"] == TAGS_METADATA_KEY
    again = gcp.launch(offer, 2, req, tags={TAG_JOB: "Job/GCP 1"})
    assert sorted(i.id for i in again) == sorted(i.id for i in made) and len(live(gcp_fake, req)) == 2
    assert sorted(i.id for i in gcp.instances({TAG_JOB: "Job/GCP 1"})) == sorted(i.id for i in made)
    assert gcp.instances({TAG_JOB: "job_gcp_1"}) == []  # same label, other tag: checked exactly
    gcp.terminate([i.id for i in made] + ["us-central1-a/never-existed", "nowhere-1a/x"], req)
    assert gcp.instances({TAG_JOB: "Job/GCP 1"}) == [] and live(gcp_fake, req) == []
    assert not [d for (z, d) in gcp_fake.app.state.disks if d.startswith(made[0].id.split("/")[1][:13])]


def test_an_n1_with_an_attached_t4_asks_for_the_accelerator(gcp: GcpProvider, gcp_fake) -> None:
    req = new_request()
    offer = next(o for o in gcp.offers() if o.instance_type.name == "n1-standard-4+T4:2"
                 and o.capacity is Capacity.ON_DEMAND)
    [inst] = gcp.launch(offer, 1, req, tags={TAG_JOB: "gpu-job"})
    raw = gcp_fake.app.state.instances[tuple(inst.id.split("/"))]
    assert raw["guestAccelerators"][0]["acceleratorCount"] == 2
    assert raw["guestAccelerators"][0]["acceleratorType"].endswith("/acceleratorTypes/nvidia-tesla-t4")
    assert raw["scheduling"]["onHostMaintenance"] == "TERMINATE" and inst.instance_type == "n1-standard-4+T4:2"
    gcp.terminate([inst.id], req)
    assert live(gcp_fake, req) == []


def test_a_stocked_out_zone_moves_the_launch_to_the_next_zone(gcp: GcpProvider, gcp_fake,
                                                            gce_faults: FaultProxy) -> None:
    gcp_fake.app.state.exhausted.add(("us-central1-a", "n2-standard-4"))
    # and in zone b the insert takes effect but its operation reports a stock-out: a late failure
    gce_faults.add(operations_in("us-central1-b"), operation_error("ZONE_RESOURCE_POOL_EXHAUSTED"))
    gcp.zones = ["us-central1-a", "us-central1-b", "us-central1-c"]
    offer = next(o for o in gcp.offers() if o.instance_type.name == "n2-standard-4"
                 and o.region == "us-central1" and o.capacity is Capacity.ON_DEMAND)
    req = new_request()
    [inst] = gcp.launch(offer, 1, req, tags={TAG_JOB: "zonal"})
    assert inst.zone == "us-central1-c" and live(gcp_fake, req) == [inst.id]  # zone b's leftover deleted
    gcp.terminate([inst.id], req)


def test_a_gang_cut_short_is_completed_in_the_same_zone_by_a_retry(gcp: GcpProvider, gce_faults: FaultProxy,
                                                                    gcp_fake) -> None:
    offer = next(o for o in gcp.offers() if o.instance_type.name == "n2-standard-4"
                 and o.region == "us-central1" and o.capacity is Capacity.ON_DEMAND)
    req = new_request()
    gcp_fake.app.state.exhausted.add(("us-central1-a", "n2-standard-4"))
    first = gcp.launch(offer, 1, req, tags={TAG_JOB: "gang"})  # lands in zone b
    gcp_fake.app.state.exhausted.clear()
    gce_faults.add(request("POST", "/instances"), gce_error("QUOTA_EXCEEDED", "Quota 'CPUS' exceeded."))
    with pytest.raises(QuotaError):
        gcp.launch(offer, 3, req, tags={TAG_JOB: "gang"})  # one exists: no zone hopping, the error surfaces
    gang = gcp.launch(offer, 3, req, tags={TAG_JOB: "gang"})
    assert first[0].id in {i.id for i in gang} and {i.zone for i in gang} == {"us-central1-b"}
    assert len(live(gcp_fake, req)) == 3
    gcp.terminate([i.id for i in gang], req)
    assert live(gcp_fake, req) == []


def test_spot_preemption_is_reported_once_by_poll_errors(gcp: GcpProvider, gcp_fake) -> None:
    req = new_request()
    offer = next(o for o in gcp.offers() if o.instance_type.name == "e2-small" and o.capacity is Capacity.SPOT)
    [inst] = gcp.launch(offer, 1, req, tags={TAG_JOB: "spotty"})
    gcp_fake.app.state.instances[tuple(inst.id.split("/"))]["status"] = "TERMINATED"  # GCE preempted it
    assert [i.state for i in gcp.instances({TAG_REQUEST: req})] == [InstanceState.TERMINATED]
    gcp.instances({TAG_REQUEST: req})
    [err] = gcp.poll_errors()
    assert isinstance(err, CapacityError) and err.code == "preempted" and inst.id in str(err)
    assert gcp.poll_errors() == []
    gcp.terminate([inst.id], req)
    assert live(gcp_fake, req) == []


CENTRAL = make_option("gcp", "us-central1", "n2-standard-4", 0.194236, vcpus=4, memory_gib=16)
EUROPE = make_option("gcp", "europe-west1", "n2-standard-4", 0.21366, vcpus=4, memory_gib=16)


def _provision(gcp: GcpProvider, options, retry: RetryPolicy | None = None):
    req = new_request()
    clock = ManualClock()
    out = provision(options, lambda name: gcp, request_id=req, tags={TAG_JOB: "job-f"}, job=None,
                    retry=retry or RetryPolicy(), clock=clock, rng=random.Random(7))
    return out, req, clock


FAILOVER_CASES = [
    ("QUOTA_EXCEEDED on insert blocks the region and fails over",
     [(request("POST", "/zones/us-central1-"), gce_error("QUOTA_EXCEEDED", "Quota 'CPUS' exceeded."), -1, False)],
     ["quota", "launched"], QuotaError),
    ("a stock-out in every zone of the region, after the insert took effect, fails over and leaves no orphan",
     [(request("POST", "/zones/us-central1-"), operation_error("ZONE_RESOURCE_POOL_EXHAUSTED"), -1, True)],
     ["capacity", "launched"], CapacityError),
]


@pytest.mark.parametrize("faults,outcomes,first_error", [c[1:] for c in FAILOVER_CASES],
                         ids=[c[0] for c in FAILOVER_CASES])
def test_failover_to_the_next_region_leaves_no_orphan(gcp: GcpProvider, gce_faults: FaultProxy, gcp_fake,
                                                      faults, outcomes, first_error) -> None:
    for match, reply, times, passthrough in faults:
        gce_faults.add(match, reply, times, passthrough=passthrough)
    out, req, _ = _provision(gcp, [CENTRAL, EUROPE])
    assert [a.outcome for a in out.attempts] == outcomes and out.option == EUROPE
    assert first_error.__name__.removesuffix("Error").lower() in out.attempts[0].outcome
    assert all(i.region == "europe-west1" for i in out.instances)
    assert [z.split("/")[0] for z in live(gcp_fake, req)] == ["europe-west1-b"]  # nothing left in us-central1
    gcp.terminate([i.id for i in out.instances], req)
    assert live(gcp_fake, req) == []


def test_rate_limits_back_off_then_succeed(gcp: GcpProvider, gce_faults: FaultProxy, gcp_fake) -> None:
    gce_faults.add(request("POST", "/instances"), gce_error("rateLimitExceeded", "Rate Limit Exceeded"), times=2)
    out, req, clock = _provision(gcp, [CENTRAL], retry=RetryPolicy(6, 10, 120))
    assert [a.outcome for a in out.attempts] == ["transient", "transient", "launched"]
    assert len(clock.sleeps) == 2 and 5 <= clock.sleeps[0] <= 10 and 10 <= clock.sleeps[1] <= 20
    gcp.terminate([i.id for i in out.instances], req)


AUTH_CASES = [
    ("a missing permission (403 forbidden) stops at once",
     gce_error("forbidden", "Required 'compute.instances.create'")),
    ("a rejected token (401) stops at once", gce_error("required", "Login Required.", status=401)),
]


@pytest.mark.parametrize("reply", [c[1] for c in AUTH_CASES], ids=[c[0] for c in AUTH_CASES])
def test_auth_errors_stop_at_once(gcp: GcpProvider, gce_faults: FaultProxy, gcp_fake, reply) -> None:
    gce_faults.add(request("POST", "/instances"), reply, times=-1)
    out, req, _ = _provision(gcp, [CENTRAL, EUROPE])
    assert [a.outcome for a in out.attempts] == ["auth"] and isinstance(out.error, AuthError)
    assert live(gcp_fake, req) == []


def test_a_billing_api_outage_is_a_typed_transient_error(gcp: GcpProvider, gce_faults: FaultProxy) -> None:
    gce_faults.add(request("GET", "/skus"), gce_error("backendError", "Backend Error", status=503), times=-1)
    with pytest.raises(TransientError, match="backendError"):
        gcp.offers()


# -- registry, refresh, CLI --------------------------------------------------------------------------------


def test_the_registry_builds_it_and_missing_credentials_say_how_to_fix(monkeypatch: pytest.MonkeyPatch,
                                                                       gcp_creds: dict[str, str],
                                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", gcp_creds["key"])
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    made = registry.create("gcp", zones=["europe-west1-b"])
    assert isinstance(made, GcpProvider) and made.project == PROJECT and made.zones == ["europe-west1-b"]
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    with pytest.raises(AuthError, match="To fix: set GOOGLE_APPLICATION_CREDENTIALS"):
        registry.create("gcp")
    (tmp_path / "bad.json").write_text('{"type": "authorized_user"}')
    with pytest.raises(AuthError, match="not|cannot"):
        GcpProvider(credentials_file=str(tmp_path / "bad.json"))


def test_refresh_makes_a_new_version_that_placement_uses(gcp: GcpProvider, tmp_path: Path) -> None:
    from pricing import CatalogStore, load_egress

    store = CatalogStore(tmp_path)
    version = refresh_catalog(["gcp"], store, providers_factory=lambda name: gcp)
    assert store.current() == version
    catalog = store.load(version)
    assert len(catalog) == len(gcp.offers())
    place = pytest.importorskip("policies.placement").place
    cpu = place(Request(name="r", vcpus=4, memory_gib=16, providers=("gcp",), spot=SpotPolicy.ALLOWED),
                catalog, load_egress(None))
    assert cpu.placement is not None
    best = cpu.placement
    assert (best.provider, best.region, best.instance_type, best.capacity) == (
        "gcp", "us-central1", "n2d-standard-4", "spot")
    assert best.hourly_usd == pytest.approx(4 * 0.006606 + 16 * 0.000886)
    gpu = place(Request(name="g", vcpus=2, memory_gib=8, gpus=1, accelerator="T4", providers=("gcp",)),
                catalog, load_egress(None))
    assert gpu.placement is not None and gpu.placement.instance_type == "n1-standard-4+T4:1"
    assert gpu.placement.hourly_usd == pytest.approx(4 * 0.031611 + 15 * 0.004237 + 0.35)


def test_options_come_from_the_environment() -> None:
    env = {"BROKER_GCP_ZONES": "us-central1-a, europe-west1-b", "BROKER_GCP_ENDPOINT": "https://127.0.0.1:3",
           "BROKER_GCP_BILLING_URL": "https://127.0.0.1:4", "BROKER_GCP_TOKEN_CACHE": "/t.json",
           "BROKER_CA_BUNDLE": "/ca.pem"}
    assert options_from_env("gcp", env) == {"zones": ["us-central1-a", "europe-west1-b"],
                                            "endpoint": "https://127.0.0.1:3", "billing_url": "https://127.0.0.1:4",
                                            "token_cache": "/t.json", "ca_bundle": "/ca.pem"}


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GOOGLE_", "BROKER_"))}
    env.update({"HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true", "COLUMNS": "200"}, **extra)
    return env


@pytest.mark.slow
def test_cli_check_shows_gcp_with_its_credential_source_and_refresh_works(
        gcp_creds: dict[str, str], gcp_proxy: FaultProxy, pki, tmp_path: Path) -> None:
    env = _env(tmp_path, GOOGLE_APPLICATION_CREDENTIALS=gcp_creds["key"])
    r = subprocess.run([*BROKER, "providers", "check", "--json"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    [gcp] = [c for c in json.loads(r.stdout) if c["name"] == "gcp"]
    assert gcp["usable"] and "GOOGLE_APPLICATION_CREDENTIALS" in gcp["credentials_source"]
    assert gcp_creds["email"] in gcp["credentials_source"]
    env |= {"BROKER_GCP_ENDPOINT": gcp_proxy.url, "BROKER_GCP_BILLING_URL": gcp_proxy.url,
            "BROKER_GCP_ZONES": "europe-west1-b", "BROKER_GCP_TOKEN_CACHE": gcp_creds["token"],
            "BROKER_CA_BUNDLE": pki.ca_cert}
    r = subprocess.run([*BROKER, "catalog", "refresh", "--provider", "gcp", "--data-dir", str(tmp_path / "d")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    from pricing import CatalogStore

    store = CatalogStore(tmp_path / "d")
    [(version, _, label)] = store.versions()
    assert version in r.stdout and "gcp" in label
    catalog = store.load(version)
    n2 = [o for o in catalog.offers(range(len(catalog))) if o.instance_type.name == "n2-standard-4"]
    assert sorted((o.region, str(o.capacity), round(o.hourly_usd, 6)) for o in n2) == [
        ("europe-west1", "on-demand", round(1.1 * 0.194236, 6)),
        ("europe-west1", "spot", round(1.1 * (4 * 0.007594 + 16 * 0.001018), 6))]


# -- jobs: the startup-script runs in the fake's guest, the exit code and log tail come back -------------


def wait_done(provider: Any, req: str) -> Instance:
    return wait_ended(provider, req)


def inventory(gcp_fake, req: str) -> list[str]:
    """Everything of ``req`` the fake still holds: instances and disks."""
    want = gce_label(req)
    disks = [f"disk {z}/{n}" for (z, n), d in gcp_fake.app.state.disks.items()
             if any(u.rsplit("/", 1)[-1] in {i.split("/")[1] for i in live(gcp_fake, req)} for u in d["users"])
             or (d.get("labels") or {}).get(TAG_REQUEST) == want]
    return live(gcp_fake, req) + disks


def all_disks(gcp_fake) -> int:
    return len(gcp_fake.app.state.disks)


def _job_offer(gcp: GcpProvider, capacity: Capacity = Capacity.ON_DEMAND, region: str = "us-central1"):
    return next(o for o in gcp.offers() if o.instance_type.name == "e2-small" and o.capacity is capacity
                and o.region == region)


JOB_CASES = [
    ("a command that succeeds ends SUCCEEDED with code 0 and its output", ("sh", "-c", "echo hello from $WHO"),
     InstanceState.SUCCEEDED, 0, "hello from gce\n"),
    ("a failing command ends FAILED with its own code and stderr", ("sh", "-c", "echo broke >&2; exit 7"),
     InstanceState.FAILED, 7, "broke\n"),
]


@pytest.mark.parametrize(("command", "state", "code", "tail"), [c[1:] for c in JOB_CASES],
                         ids=[c[0] for c in JOB_CASES])
def test_a_job_runs_in_the_startup_script_and_reports_through_the_serial_port(
    gcp: GcpProvider, gcp_fake, command, state, code, tail
) -> None:
    req = new_request()
    disks_before = all_disks(gcp_fake)
    job = make_job("gce-job", command=command, env={"WHO": "gce"})
    [inst] = gcp.launch(_job_offer(gcp), 1, req, tags={TAG_JOB: "gce-job"}, job=job)
    raw = gcp_fake.app.state.instances[tuple(inst.id.split("/"))]
    script = next(i["value"] for i in raw["metadata"]["items"] if i["key"] == STARTUP_SCRIPT_KEY)
    assert script.startswith("#!/bin/sh\n") and "maxRunDuration" in raw["scheduling"]
    done = wait_done(gcp, req)
    assert (done.state, done.exit_code, done.log_tail) == (state, code, tail)
    gcp.terminate([done.id], req)
    assert inventory(gcp_fake, req) == [] and all_disks(gcp_fake) == disks_before


def test_a_cancelled_job_is_deleted_with_its_disk(gcp: GcpProvider, gcp_fake) -> None:
    req = new_request()
    disks_before = all_disks(gcp_fake)
    [inst] = gcp.launch(_job_offer(gcp), 1, req, tags={TAG_JOB: "gce-cancel"},
                        job=make_job("gce-cancel", command=("sleep", "30")))
    assert [i.state for i in gcp.instances({TAG_REQUEST: req})] == [InstanceState.RUNNING]
    gcp.terminate([inst.id], f"{req}:cancel")
    assert inventory(gcp_fake, req) == [] and all_disks(gcp_fake) == disks_before


def test_a_preempted_spot_job_is_reported_and_leaves_nothing_once_deleted(gcp: GcpProvider, gcp_fake) -> None:
    req = new_request()
    disks_before = all_disks(gcp_fake)
    [inst] = gcp.launch(_job_offer(gcp, Capacity.SPOT), 1, req, tags={TAG_JOB: "gce-spot"},
                        job=make_job("gce-spot", command=("sleep", "30")))
    gcp_fake.app.state.preempt(*inst.id.split("/"))
    done = wait_done(gcp, req)
    assert (done.state, done.exit_code) == (InstanceState.TERMINATED, None)  # no report: the job did not end
    [err] = gcp.poll_errors()
    assert isinstance(err, CapacityError) and err.code == "preempted"
    gcp.terminate([done.id], req)
    assert inventory(gcp_fake, req) == [] and all_disks(gcp_fake) == disks_before


def test_a_stocked_out_region_fails_over_and_the_job_runs_in_the_next(gcp: GcpProvider, gcp_fake,
                                                                     gce_faults: FaultProxy) -> None:
    for z in ("us-central1-a", "us-central1-b"):
        gcp_fake.app.state.exhausted.add((z, "e2-small"))
    disks_before = all_disks(gcp_fake)
    req = new_request()
    central = make_option("gcp", "us-central1", "e2-small", 0.02)
    europe = make_option("gcp", "europe-west1", "e2-small", 0.022)
    out = provision([central, europe], lambda name: gcp, request_id=req, tags={TAG_JOB: "gce-fo"},
                    job=make_job("gce-fo", command=("sh", "-c", "exit 0")), retry=RetryPolicy(),
                    clock=ManualClock(), rng=random.Random(1))
    assert [a.outcome for a in out.attempts] == ["capacity", "launched"] and out.option == europe
    done = wait_done(gcp, req)
    assert (done.region, done.state, done.exit_code) == ("europe-west1", InstanceState.SUCCEEDED, 0)
    gcp.terminate([done.id], req)
    assert inventory(gcp_fake, req) == [] and all_disks(gcp_fake) == disks_before


STRICT_CASES = [
    ("no boot disk", lambda b: b.update(disks=[]), "required"),
    ("a boot disk without an image", lambda b: b["disks"][0]["initializeParams"].pop("sourceImage"), "required"),
    ("no network interface", lambda b: b.pop("networkInterfaces"), "required"),
    ("an unknown network", lambda b: b["networkInterfaces"][0].update(network="global/networks/nope"),
     "notFound"),
    ("a Spot VM that restarts automatically", lambda b: b["scheduling"].update(automaticRestart=True),
     "invalid"),
    ("a bad metadata key", lambda b: b["metadata"]["items"].append({"key": "bad key!", "value": "x"}), "invalid"),
    ("no machine type", lambda b: b.pop("machineType"), "required"),
]


@pytest.mark.parametrize(("mutate", "reason"), [c[1:] for c in STRICT_CASES], ids=[c[0] for c in STRICT_CASES])
def test_the_fake_refuses_inserts_gce_refuses(gcp: GcpProvider, gcp_fake, pki, mutate, reason) -> None:
    offer = _job_offer(gcp, Capacity.SPOT)
    body = gcp.instance_body(offer, "us-central1-a", f"hb-strict-{uuid.uuid4().hex[:6]}", {TAG_REQUEST: "s"})
    mutate(body)
    resp = httpx.post(f"{gcp_fake.url}/compute/v1/projects/{PROJECT}/zones/us-central1-a/instances", json=body,
                      headers={"Authorization": "Bearer fake"}, verify=pki.ca_cert, timeout=10)
    assert resp.status_code in (400, 404) and resp.json()["error"]["errors"][0]["reason"] == reason


# -- credentials: Application Default Credentials through google-auth --------------------------------------


def test_google_auth_credentials_are_refreshed_and_sign_the_compute_calls(
    gcp_fake, gce_faults: FaultProxy, pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ADC yields (user credentials with a refresh token; workload identity's are refreshed the same
    way): the first call refreshes at the token endpoint and that token signs the insert."""
    google_credentials = pytest.importorskip("google.oauth2.credentials")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", pki.ca_cert)  # google-auth's transport trusts the fake's CA
    creds = google_credentials.Credentials(token=None, refresh_token="1//refresh", client_id="c", client_secret="s",
                                           token_uri=f"{gcp_fake.url}/token")
    gcp = GcpProvider(PROJECT, zones=ZONES, credentials=creds, endpoint=gce_faults.url, billing_url=gce_faults.url,
                      ca_bundle=pki.ca_cert, poll_interval_seconds=0)
    req = new_request()
    [inst] = gcp.launch(make_offer("gcp", "us-central1", "e2-small", 0.02), 1, req, tags={TAG_JOB: "adc"})
    issued = gcp_fake.app.state.issued
    assert issued and issued[-1] in gcp_fake.app.state.bearers  # the refreshed token signed the insert
    gcp.terminate([inst.id], req)


# -- workload identity federation: google-auth's own token exchange against the STS / IAM credentials fake

SA_EMAIL = f"hb-broker@{PROJECT}.iam.gserviceaccount.com"
JWT = "urn:ietf:params:oauth:token-type:jwt"


def _wif_config(tmp_path: Path, gcp_fake, *, impersonate: bool) -> Path:
    """An ``external_account`` file as ``gcloud iam workload-identity-pools create-cred-config`` writes it, its
    subject token (the external IdP's OIDC token) in a file the pool trusts."""
    token = tmp_path / "oidc-token"
    token.write_text(f"eyJ.oidc-{uuid.uuid4().hex[:8]}.sig")
    gcp_fake.app.state.wif["subject_tokens"].add(token.read_text())
    doc: dict[str, Any] = {"type": "external_account", "audience": gcp_fake.app.state.wif["audience"],
                           "subject_token_type": JWT, "token_url": f"{gcp_fake.url}/v1/token",
                           "credential_source": {"file": str(token)}}
    if impersonate:
        doc["service_account_impersonation_url"] = (
            f"{gcp_fake.url}/v1/projects/-/serviceAccounts/{SA_EMAIL}:generateAccessToken")
    path = tmp_path / "wif.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("impersonate", [True, False],
                         ids=["with service account impersonation the SA token signs the compute calls",
                              "without impersonation the federated token signs them"])
def test_workload_identity_exchanges_the_token_through_google_auth_and_the_adapter_uses_it(
        impersonate: bool, tmp_path: Path, gcp_fake, gce_faults: FaultProxy, pki,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("google.auth.identity_pool")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", pki.ca_cert)  # google-auth's transport trusts the fake's CA
    wif = gcp_fake.app.state.wif
    federated, impersonated = len(wif["federated"]), len(wif["impersonated"])
    gcp = GcpProvider(PROJECT, zones=ZONES, credentials_file=str(_wif_config(tmp_path, gcp_fake,
                                                                              impersonate=impersonate)),
                      endpoint=gce_faults.url, billing_url=gce_faults.url, ca_bundle=pki.ca_cert,
                      poll_interval_seconds=0)
    assert type(gcp.google_credentials).__module__ == "google.auth.identity_pool"
    assert len(wif["federated"]) == federated, "no exchange before the first API call"
    req = new_request()
    [inst] = gcp.launch(make_offer("gcp", "us-central1", "e2-small", 0.02), 1, req, tags={TAG_JOB: "wif"})
    assert len(wif["federated"]) == federated + 1, "one STS exchange, then the token is cached"
    sts_token = wif["federated"][-1]
    if impersonate:
        assert len(wif["impersonated"]) == impersonated + 1
        assert wif["impersonated"][-1] in gcp_fake.app.state.bearers and sts_token not in gcp_fake.app.state.bearers
    else:
        assert len(wif["impersonated"]) == impersonated and sts_token in gcp_fake.app.state.bearers
    gcp.terminate([inst.id], req)
    assert gcp.instances({TAG_REQUEST: req}) == []


def test_a_subject_token_the_pool_does_not_trust_is_an_auth_error_at_the_first_call(
        tmp_path: Path, gcp_fake, gce_faults: FaultProxy, pki, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("google.auth.identity_pool")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", pki.ca_cert)
    path = _wif_config(tmp_path, gcp_fake, impersonate=True)
    (tmp_path / "oidc-token").write_text("eyJ.forged.sig")
    gcp = GcpProvider(PROJECT, zones=ZONES, credentials_file=str(path), endpoint=gce_faults.url,
                      billing_url=gce_faults.url, ca_bundle=pki.ca_cert, poll_interval_seconds=0)
    with pytest.raises(AuthError, match="invalid_grant"):
        gcp.launch(make_offer("gcp", "us-central1", "e2-small", 0.02), 1, new_request(), tags={TAG_JOB: "wif-x"})


STS_FORM = {"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "requested_token_type": "urn:ietf:params:oauth:token-type:access_token", "subject_token_type": JWT,
            "scope": "https://www.googleapis.com/auth/cloud-platform"}
STS_CASES = [
    ("no grant_type is invalid_request", {"grant_type": None}, "invalid_request"),
    ("another grant type is unsupported_grant_type", {"grant_type": "client_credentials"}, "unsupported_grant_type"),
    ("no subject_token is invalid_request", {"subject_token": None}, "invalid_request"),
    ("an unknown subject_token_type is invalid_request", {"subject_token_type": "urn:x:token"}, "invalid_request"),
    ("a requested token type other than access_token is invalid_request",
     {"requested_token_type": "urn:ietf:params:oauth:token-type:id_token"}, "invalid_request"),
    ("another pool's audience is invalid_target", {"audience": "//iam.googleapis.com/projects/1/locations/global/"
                                                   "workloadIdentityPools/other/providers/p"}, "invalid_target"),
    ("a subject token the provider does not trust is invalid_grant", {"subject_token": "eyJ.forged"},
     "invalid_grant"),
    ("options that are not JSON are invalid_request", {"options": "{not json"}, "invalid_request"),
]


@pytest.mark.parametrize(("change", "error"), [c[1:] for c in STS_CASES], ids=[c[0] for c in STS_CASES])
def test_the_sts_fake_refuses_malformed_exchanges_as_sts_does(change: dict[str, Any], error: str, gcp_fake,
                                                              pki) -> None:
    gcp_fake.app.state.wif["subject_tokens"].add("eyJ.good")
    form = STS_FORM | {"audience": gcp_fake.app.state.wif["audience"], "subject_token": "eyJ.good"} | change
    r = httpx.post(f"{gcp_fake.url}/v1/token", data={k: v for k, v in form.items() if v is not None},
                   verify=pki.ca_cert)
    assert r.status_code == 400 and r.json()["error"] == error, r.text
    ok = httpx.post(f"{gcp_fake.url}/v1/token", data=STS_FORM | {"audience": gcp_fake.app.state.wif["audience"],
                                                                 "subject_token": "eyJ.good"}, verify=pki.ca_cert)
    assert ok.status_code == 200 and set(ok.json()) == {"access_token", "issued_token_type", "token_type",
                                                         "expires_in"}


IAM_CASES = [
    ("no bearer is UNAUTHENTICATED", None, SA_EMAIL, {"scope": ["s"]}, 401, "UNAUTHENTICATED"),
    ("a bearer STS did not issue is UNAUTHENTICATED", "ya29.forged", SA_EMAIL, {"scope": ["s"]}, 401,
     "UNAUTHENTICATED"),
    ("no scope is INVALID_ARGUMENT", "sts", SA_EMAIL, {"lifetime": "3600s"}, 400, "INVALID_ARGUMENT"),
    ("a lifetime over an hour is INVALID_ARGUMENT", "sts", SA_EMAIL, {"scope": ["s"], "lifetime": "7200s"}, 400,
     "INVALID_ARGUMENT"),
    ("a service account the principal may not use is PERMISSION_DENIED", "sts",
     f"other@{PROJECT}.iam.gserviceaccount.com", {"scope": ["s"]}, 403, "PERMISSION_DENIED"),
    ("the documented request is answered", "sts", SA_EMAIL, {"scope": ["s"], "lifetime": "1800s"}, 200, None),
]


@pytest.mark.parametrize(("bearer", "email", "body", "status", "code"), [c[1:] for c in IAM_CASES],
                         ids=[c[0] for c in IAM_CASES])
def test_the_iam_credentials_fake_answers_generate_access_token_as_documented(
        bearer: str | None, email: str, body: dict[str, Any], status: int, code: str | None, gcp_fake, pki) -> None:
    wif = gcp_fake.app.state.wif
    wif["subject_tokens"].add("eyJ.good")
    sts = httpx.post(f"{gcp_fake.url}/v1/token", data=STS_FORM | {"audience": wif["audience"],
                                                                  "subject_token": "eyJ.good"}, verify=pki.ca_cert)
    token = sts.json()["access_token"] if bearer == "sts" else bearer
    r = httpx.post(f"{gcp_fake.url}/v1/projects/-/serviceAccounts/{email}:generateAccessToken", json=body,
                   headers={"Authorization": f"Bearer {token}"} if token else {}, verify=pki.ca_cert)
    assert r.status_code == status, r.text
    if code is not None:
        assert r.json()["error"]["status"] == code
    else:
        assert set(r.json()) == {"accessToken", "expireTime"} and r.json()["expireTime"].endswith("Z")


def test_an_adc_file_of_a_user_login_is_loaded_through_google_auth(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("google.auth")
    adc = tmp_path / "application_default_credentials.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "c", "client_secret": "s",
                               "refresh_token": "1//r", "quota_project_id": "quota-proj"}))
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    gcp = GcpProvider(zones=ZONES, credentials_file=str(adc))
    assert gcp.project == "quota-proj" and type(gcp.google_credentials).__name__ == "Credentials"


def test_a_file_that_is_no_credential_is_a_clear_auth_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"type": "nonsense"}))
    with pytest.raises(AuthError, match="To fix"):
        GcpProvider(PROJECT, credentials_file=str(bad))


CHECK_CASES = [
    ("an authorized_user ADC file is a credential source", {"type": "authorized_user", "client_id": "c",
                                                             "client_secret": "s", "refresh_token": "r"},
     {"GOOGLE_CLOUD_PROJECT": "p1"}, True, "authorized user"),
    ("a workload identity (external_account) file is a credential source",
     {"type": "external_account", "audience": "//iam.googleapis.com/x", "subject_token_type": "t",
      "token_url": "https://sts.googleapis.com/v1/token", "credential_source": {"file": "/t"}},
     {"GOOGLE_CLOUD_PROJECT": "p1"}, True, "external account"),
    ("a JSON that is no credential is refused", {"type": "nonsense"}, {"GOOGLE_CLOUD_PROJECT": "p1"}, False, ""),
]


@pytest.mark.parametrize(("doc", "env", "usable", "source"), [c[1:] for c in CHECK_CASES],
                         ids=[c[0] for c in CHECK_CASES])
def test_check_recognises_adc_and_workload_identity(doc, env, usable, source, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cred.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    [gcp] = [c for c in registry.check() if c.name == "gcp"]
    assert gcp.usable is usable and source in gcp.credentials_source
    assert usable or "To fix" in gcp.reason


def test_check_recognises_the_metadata_server_when_told(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud ADC file here
    monkeypatch.setenv("BROKER_GCP_METADATA", "true")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p2")
    [gcp] = [c for c in registry.check() if c.name == "gcp"]
    assert gcp.usable and "metadata server" in gcp.credentials_source


def test_a_preemption_notice_stops_the_spot_job_which_reports_it_and_is_placed_again(gcp: GcpProvider,
                                                                                    gcp_fake) -> None:
    req = new_request()
    job = make_job("gce-notice", command=("sh", "-c", "trap 'echo checkpoint; exit 0' TERM; "
                                                      "while :; do sleep 0.1; done"))
    [inst] = gcp.launch(_job_offer(gcp, Capacity.SPOT), 1, req, tags={TAG_JOB: "gce-notice"}, job=job)
    raw = gcp_fake.app.state.instances[tuple(inst.id.split("/"))]
    script = next(i["value"] for i in raw["metadata"]["items"] if i["key"] == STARTUP_SCRIPT_KEY)
    assert "instance/preempted" in script  # spot: the watcher is in the script the VM got
    gcp.instances({TAG_REQUEST: req})  # the guest boots with the insert's operation
    gcp_fake.app.state.notice(*inst.id.split("/"))
    done = wait_done(gcp, req)
    assert (done.state, done.exit_code) == (InstanceState.TERMINATED, None)  # not SUCCEEDED: it was cut short
    [err] = gcp.poll_errors()
    assert isinstance(err, CapacityError) and err.code == "preempted"
    gcp.terminate([done.id], req)
    assert live(gcp_fake, req) == []
