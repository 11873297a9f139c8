"""The egress/bandwidth model (routes, tiers, sites, overrides) and the on-prem inventory file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from broker.errors import SpecError
from broker.model import Capacity, Location
from pricing import load_egress, load_inventory
from pricing.egress import DEFAULT_EGRESS_PATH, GBIT_PER_GIB
from pricing.inventory import Link, Site

DATA = yaml.safe_load(DEFAULT_EGRESS_PATH.read_text())


def _rate(provider: str, kind: str) -> float:
    return float(DATA["providers"][provider]["inter_region"][kind])


@pytest.mark.parametrize(
    ("src", "dst", "usd", "gbps"),
    [
        ("aws:us-east-1", "aws:us-east-1", 0.0, DATA["same_region"]["gbps"]),
        ("gcp:europe-west4", "gcp:europe-west4", 0.0, DATA["same_region"]["gbps"]),
        ("aws:us-east-1", "aws:us-west-2", _rate("aws", "same_continent_usd_per_gib"),
         DATA["bandwidth_gbps"]["inter_region_same_continent"]),
        ("gcp:us-central1", "gcp:asia-east1", _rate("gcp", "cross_continent_usd_per_gib"),
         DATA["bandwidth_gbps"]["inter_region_cross_continent"]),
        ("azure:westeurope", "azure:northeurope", _rate("azure", "same_continent_usd_per_gib"),
         DATA["bandwidth_gbps"]["inter_region_same_continent"]),
        ("aws:eu-west-1", "gcp:europe-west4", DATA["providers"]["aws"]["internet"][0]["usd_per_gib"],
         DATA["bandwidth_gbps"]["internet"]),
        ("gcp:us-central1", "azure:eastus", DATA["providers"]["gcp"]["internet"][0]["usd_per_gib"],
         DATA["bandwidth_gbps"]["internet"]),
    ],
    ids=[
        "same region is free",
        "same gcp region is free",
        "aws inter-region within a continent",
        "gcp across continents",
        "azure within europe",
        "aws to another cloud pays aws internet egress",
        "gcp to azure pays gcp internet egress",
    ],
)
def test_routes(src: str, dst: str, usd: float, gbps: float) -> None:
    m = load_egress()
    assert m.usd_per_gib(src, dst) == pytest.approx(usd)
    assert m.gbps(src, dst) == pytest.approx(gbps)
    expect_h = 0.0 if src == dst else 100 * GBIT_PER_GIB / gbps / 3600
    assert m.transfer_hours(src, dst, 100) == pytest.approx(expect_h)


@pytest.mark.parametrize(
    ("src", "dst", "usd"),
    [
        ("aws:us-east-1", "aws:eu-west-1", 0.02),
        ("aws:eu-central-1", "aws:us-west-2", 0.02),
        ("aws:ap-northeast-1", "aws:us-east-1", 0.09),
        ("aws:ap-southeast-2", "aws:ap-northeast-1", 0.098),
        ("aws:sa-east-1", "aws:us-east-1", 0.138),
        ("aws:me-south-1", "aws:eu-west-1", 0.1105),
        ("aws:af-south-1", "aws:eu-west-1", 0.147),
        ("gcp:us-central1", "gcp:europe-west4", 0.05),
        ("gcp:europe-west1", "gcp:us-east4", 0.05),
        ("gcp:us-central1", "gcp:us-east4", 0.02),
        ("gcp:us-central1", "gcp:asia-east1", 0.08),
        ("gcp:asia-east1", "gcp:asia-northeast1", 0.05),
        ("gcp:southamerica-east1", "gcp:us-central1", 0.14),
        ("azure:eastus", "azure:westeurope", 0.05),
        ("azure:westeurope", "azure:northeurope", 0.02),
        ("azure:japaneast", "azure:eastus", 0.08),
        ("azure:brazilsouth", "azure:eastus", 0.16),
    ],
)
def test_inter_region_rates_follow_the_source_continent_tables(src: str, dst: str, usd: float) -> None:
    """The published per-source-continent inter-region rates (docs/CATALOG.md, egress-v1.yaml): AWS is not a
    flat $0.02 (up to ~7x from Africa), GCP North America <-> Europe is $0.05, not the $0.08 default."""
    assert load_egress().usd_per_gib(src, dst) == pytest.approx(usd)


def test_aws_cross_az_pays_both_sides() -> None:
    m = load_egress()
    a = Location("aws", "us-east-1", "use1-az1", continent="na")
    b = Location("aws", "us-east-1", "use1-az2", continent="na")
    assert m.usd_per_gib(a, b) == pytest.approx(0.01 + 0.01)
    assert m.egress_usd(a, b, 100) == pytest.approx(2.0)


def test_cross_zone_in_one_region_uses_the_zone_rate() -> None:
    m = load_egress()
    a = Location("aws", "us-east-1", "use1-az1", continent="na")
    b = Location("aws", "us-east-1", "use1-az2", continent="na")
    assert m.usd_per_gib(a, b) == DATA["providers"]["aws"]["cross_zone_usd_per_gib"]
    assert m.usd_per_gib(a, "aws:us-east-1") == 0.0  # zone unknown on one side: same place


def test_internet_tiers_apply_to_one_transfer() -> None:
    m = load_egress()
    tiers = DATA["providers"]["aws"]["internet"]
    size = 60_000.0
    expect = 0.0
    prev = 0.0
    for t in tiers:
        up = float("inf") if t["up_to_gib"] is None else t["up_to_gib"]
        if size > prev:
            expect += (min(size, up) - prev) * t["usd_per_gib"]
        prev = up
    assert m.egress_usd("aws:us-east-1", "azure:eastus", size) == pytest.approx(expect)
    assert m.egress_usd("aws:us-east-1", "azure:eastus", size) < size * tiers[0]["usd_per_gib"]


def test_sites_links_and_uplinks() -> None:
    rack = Site("rack-a", "onprem", "eu", uplink_gbps=0.5, egress_usd_per_gib=0.01, ingress_usd_per_gib=0.002,
                links=(Link("aws:eu-west-1", 10.0, 0.005),))
    m = load_egress().with_sites([rack])
    assert m.usd_per_gib("onprem:rack-a", "aws:eu-west-1") == 0.005  # the link, both directions
    assert m.usd_per_gib("aws:eu-west-1", "onprem:rack-a") == 0.005
    assert m.gbps("onprem:rack-a", "aws:eu-west-1") == 10.0
    assert m.usd_per_gib("onprem:rack-a", "gcp:europe-west4") == 0.01  # site egress; clouds take ingress free
    aws_first = DATA["providers"]["aws"]["internet"][0]["usd_per_gib"]
    assert m.usd_per_gib("aws:us-east-1", "onprem:rack-a") == pytest.approx(aws_first + 0.002)
    assert m.gbps("aws:us-east-1", "onprem:rack-a") == 0.5  # the uplink caps it
    assert m.usd_per_gib("onprem:rack-a", "onprem:rack-a") == 0.0


def test_vectorised_costs_equal_the_scalar_ones() -> None:
    m = load_egress().with_sites([Site("rack-a", continent="eu")])
    locs = [m.location(k) for k in ("aws:us-east-1", "aws:eu-west-1", "gcp:europe-west4", "azure:eastus",
                                     "onprem:rack-a")]
    usd, hours = m.to_locations("aws:eu-west-1", 750.0, locs)
    for i, loc in enumerate(locs):
        assert usd[i] == pytest.approx(m.egress_usd("aws:eu-west-1", loc, 750.0))
        assert hours[i] == pytest.approx(m.transfer_hours("aws:eu-west-1", loc, 750.0))


def test_override_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "egress.yaml"
    f.write_text("providers: {aws: {inter_region: {same_continent_usd_per_gib: 0.5}}}\n"
                 "sites: {'onprem:local': {egress_usd_per_gib: 0.07}}\n")
    monkeypatch.setenv("BROKER_EGRESS_CONFIG", str(f))
    m = load_egress()
    assert m.usd_per_gib("aws:us-east-1", "aws:us-west-2") == 0.5
    assert m.usd_per_gib("aws:us-east-1", "aws:eu-west-1") == _rate("aws", "cross_continent_usd_per_gib")
    assert m.usd_per_gib("onprem:local", "gcp:us-central1") == 0.07
    f.write_text("sites: {'onprem:local': {bogus: 1}}\n")
    with pytest.raises(SpecError, match="bogus"):
        load_egress()
    f.write_text("providers: [unclosed\n")
    with pytest.raises(SpecError, match="invalid YAML"):
        load_egress()


def test_default_inventory_is_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BROKER_INVENTORY", raising=False)
    inv = load_inventory()
    (offer,) = inv.offers()
    assert offer.location.key == "onprem:local"
    assert offer.capacity == Capacity.OWNED
    assert offer.instance_type.vcpus == float(os.cpu_count() or 1)
    assert offer.instance_type.memory_gib > 0


def test_inventory_file(tmp_path: Path) -> None:
    f = tmp_path / "inv.yaml"
    f.write_text(
        "sites:\n"
        "  - {name: rack-a, continent: eu, uplink_gbps: 10, egress_usd_per_gib: 0.01,\n"
        "     links: [{to: 'aws:eu-west-1', gbps: 10, usd_per_gib: 0.02}]}\n"
        "  - {name: pi-7, provider: edge, continent: eu, uplink_gbps: 0.05}\n"
        "hosts:\n"
        "  - {name: gpu-1, site: rack-a, vcpus: 32, memory_gib: 256, gpus: 4, accelerator: A100,"
        " owned_usd_per_hour: 1.5}\n"
        "  - {name: pi, site: pi-7, vcpus: 4, memory_gib: 8, arch: arm64}\n"
    )
    inv = load_inventory(f)
    offers = {o.instance_type.name: o for o in inv.offers()}
    assert offers["gpu-1"].location.key == "onprem:rack-a" and offers["gpu-1"].hourly_usd == 1.5
    assert offers["gpu-1"].instance_type.accelerator == "A100"
    assert offers["pi"].location.key == "edge:pi-7" and offers["pi"].instance_type.arch == "arm64"
    assert inv.site("rack-a").links[0].to == "aws:eu-west-1"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("sites: [{name: a, provider: moon}]", "sites[0].provider"),
        ("sites: [{name: a, uplink_gbps: -1}]", "sites[0].uplink_gbps"),
        ("hosts: [{name: h, site: nowhere}]", "hosts[0].site"),
        ("hosts: [{name: h, vcpus: many}]", "hosts[0].vcpus"),
        ("colour: blue", "colour"),
        ("sites: [unclosed", "invalid YAML"),
    ],
    ids=["unknown site provider", "negative uplink", "host on an undefined site", "non-numeric vcpus",
         "unknown top-level key", "malformed yaml"],
)
def test_inventory_errors_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    f = tmp_path / "inv.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as exc:
        load_inventory(f)
    assert field in str(exc.value)
