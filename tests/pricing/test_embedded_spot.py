"""Spot offers of the embedded catalog: GCE ``preemptible`` rates composed into machine types, Azure
``lowpriority<size>`` keys. Every expectation is recomputed here from Libcloud's raw ``pricing.json``
(read directly, not through the loader), so a loader that mis-composes, mis-names or mis-counts fails."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from broker.cli import main
from broker.model import Capacity, Offer, Provenance, SpotPolicy
from policies.placement import place
from pricing import Catalog, CatalogBuilder, flag_outliers, load_egress, load_embedded
from pricing.embedded import RETIRED_REGIONS, libcloud_pricing_path
from tests.pricing.catalog_builders import make_request, shared_core_rows

NOW = datetime(2026, 6, 1, tzinfo=UTC)
SPOT_CODE = 1  # CAPACITIES.index(Capacity.SPOT), spelled out so that a reordering is caught


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_embedded(list_prices=False)  # Libcloud's rows only: this file checks them against its raw data


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    compute: dict[str, Any] = json.loads(libcloud_pricing_path().read_text())["compute"]
    return compute


@pytest.fixture(scope="module")
def by_key(cat: Catalog) -> dict[tuple[str, str, str, str], Offer]:
    """(provider, region, instance type, capacity) -> offer (the embedded catalog has no zones)."""
    out: dict[tuple[str, str, str, str], Offer] = {}
    for o in cat.offers(range(len(cat))):
        key = (o.provider, o.region, o.instance_type.name, o.capacity.value)
        assert key not in out, f"duplicate offer {key}"
        out[key] = o
    return out


def _rate(raw: dict[str, Any], family: str, part: str, kind: str, region: str) -> float:
    v = raw["gce_instances"][family].get(part, {}).get(kind, {}).get(region)
    return float(v["price"] if isinstance(v, dict) else (v or 0.0))


# GCE shapes from GCE's machine-type documentation: name -> (vCPUs, GiB); f1/g1 are priced per instance.
GCE_SHAPES = [
    pytest.param("n1-standard-4", 4, 15.0, id="n1-standard-4 is 4 vCPUs and 15 GiB"),
    pytest.param("n1-highmem-16", 16, 104.0, id="n1-highmem-16 is 16 vCPUs and 104 GiB"),
    pytest.param("n2-standard-8", 8, 32.0, id="n2-standard-8 is 8 vCPUs and 32 GiB"),
    pytest.param("n2d-highcpu-224", 224, 224.0, id="n2d-highcpu-224 is 224 vCPUs and 224 GiB"),
    pytest.param("e2-highmem-4", 4, 32.0, id="e2-highmem-4 is 4 vCPUs and 32 GiB"),
    pytest.param("c2-standard-30", 30, 120.0, id="c2-standard-30 is 30 vCPUs and 120 GiB"),
    pytest.param("m1-ultramem-40", 40, 961.0, id="m1-ultramem-40 is 40 vCPUs and 961 GiB"),
    pytest.param("f1-micro", 0.2, 0.6, id="f1-micro is a shared-core instance priced whole"),
    pytest.param("g1-small", 0.5, 1.7, id="g1-small is a shared-core instance priced whole"),
]


@pytest.mark.parametrize(("name", "vcpus", "mem"), GCE_SHAPES)
def test_gce_spot_price_is_the_preemptible_rates_composed_in_every_priced_region(
    cat: Catalog, raw: dict[str, Any], by_key: dict[tuple[str, str, str, str], Offer], name: str, vcpus: float,
    mem: float,
) -> None:
    family = name.split("-")[0]
    shared = family in ("f1", "g1")
    regions = sorted(raw["gce_instances"][family]["cpu"]["preemptible"])
    expected: dict[str, float] = {}
    for r in regions:
        cpu = _rate(raw, family, "cpu", "preemptible", r)
        ram = 0.0 if shared else _rate(raw, family, "ram", "preemptible", r)
        if cpu > 0 and (shared or ram > 0):
            expected[r] = cpu if shared else vcpus * cpu + mem * ram
    assert expected, f"Libcloud prices no preemptible {family} anywhere"
    got = {r: o for (p, r, t, c), o in by_key.items() if p == "gcp" and t == name and c == "spot"}
    assert set(got) == set(expected)
    for r, o in got.items():
        assert o.hourly_usd == pytest.approx(expected[r], abs=1e-6), r
        assert (o.instance_type.vcpus, o.instance_type.memory_gib) == pytest.approx((vcpus, mem))
        od = by_key[("gcp", r, name, "on-demand")]
        assert od.instance_type == o.instance_type  # same specs as the on-demand row


def test_every_gce_spot_offer_is_composed_from_its_regions_preemptible_rates(
    by_key: dict[tuple[str, str, str, str], Offer], raw: dict[str, Any],
) -> None:
    spot = [o for (p, _, _, c), o in by_key.items() if p == "gcp" and c == "spot"]
    assert len({o.instance_type.name.split("-")[0] for o in spot}) >= 8  # n1 n2 n2d e2 c2 m1 f1 g1
    for o in spot:
        fam, it = o.instance_type.name.split("-")[0], o.instance_type
        cpu = _rate(raw, fam, "cpu", "preemptible", o.region)
        want = cpu if fam in ("f1", "g1") else it.vcpus * cpu + it.memory_gib * _rate(
            raw, fam, "ram", "preemptible", o.region)
        assert o.hourly_usd == pytest.approx(want, abs=1e-5), (o.instance_type.name, o.region)


def _azure_key(name: str) -> str:
    """``Standard_D2s_v3`` -> ``d2sv3`` (Libcloud's bare lowercase size)."""
    return name.lower().removeprefix("standard_").replace("_", "")


def test_every_priced_lowpriority_key_of_a_known_size_is_an_azure_spot_offer_at_its_raw_price(
    cat: Catalog, raw: dict[str, Any], by_key: dict[tuple[str, str, str, str], Offer],
) -> None:
    az: dict[str, dict[str, float]] = raw["azure_linux"]
    low = {k.removeprefix("lowpriority"): v for k, v in az.items() if k.startswith("lowpriority")}
    assert len(low) == 248
    # A size is known when the loader sizes its standard twin (an on-demand offer exists for it).
    od_sizes = {_azure_key(t) for (p, _, t, c) in by_key if p == "azure" and c == "on-demand"}
    expected = {(size, r): float(price) for size, by_region in low.items() if size in od_sizes
                for r, price in by_region.items() if price and price > 0 and f"azure:{r}" not in RETIRED_REGIONS}
    got = {(_azure_key(t), r): o for (p, r, t, c), o in by_key.items() if p == "azure" and c == "spot"}
    assert set(got) == set(expected)
    assert len({s for s, _ in got}) > 150  # most of the 248 sizes
    for key, o in got.items():
        assert o.hourly_usd == pytest.approx(expected[key], abs=1e-12)
        od = by_key[("azure", o.region, o.instance_type.name, "on-demand")]
        assert od.instance_type == o.instance_type  # same specs as the on-demand row
    # Dropped = every raw lowpriority cell that gave no offer (unknown size or not priced there).
    (p,) = [p for p in cat.provenance if p.source.endswith("azure_linux:lowpriority")]
    cells = sum(len(v) for v in low.values())
    assert (p.provider, p.rows, p.offers, p.dropped) == ("azure", cells, len(got), cells - len(got))


@pytest.mark.parametrize(
    ("name", "vcpus", "mem"),
    [
        pytest.param("Standard_D2s_v3", 2, 8, id="D2s_v3 is 2 vCPUs and 8 GiB"),
        pytest.param("Standard_E8s_v3", 8, 64, id="E8s_v3 is 8 vCPUs and 64 GiB"),
        pytest.param("Standard_E64s_v3", 64, 432, id="E64s_v3 is 64 vCPUs and 432 GiB, not 8 per vCPU"),
        pytest.param("Standard_F4s_v2", 4, 8, id="F4s_v2 is 4 vCPUs and 8 GiB"),
        pytest.param("Standard_A2m_v2", 2, 16, id="A2m_v2 is 2 vCPUs and 16 GiB"),
        pytest.param("Standard_D13_v2", 8, 56, id="D13_v2 is 8 vCPUs and 56 GiB"),
        pytest.param("Standard_L8s_v2", 8, 64, id="L8s_v2 is 8 vCPUs and 64 GiB"),
    ],
)
def test_azure_spot_sizes_carry_azures_published_specs(
    by_key: dict[tuple[str, str, str, str], Offer], name: str, vcpus: float, mem: float,
) -> None:
    spot = [o for (p, _, t, c), o in by_key.items() if p == "azure" and t == name and c == "spot"]
    assert spot
    assert {(o.instance_type.vcpus, o.instance_type.memory_gib) for o in spot} == {(vcpus, mem)}


def test_spot_is_cheaper_than_on_demand_for_the_same_type_and_region(
    by_key: dict[tuple[str, str, str, str], Offer],
) -> None:
    pairs = 0
    for (p, r, t, c), o in by_key.items():
        if c != "spot":
            continue
        od = by_key.get((p, r, t, "on-demand"))
        assert od is not None, f"spot {p}:{r} {t} has no on-demand twin"
        assert o.hourly_usd < od.hourly_usd, (p, r, t, o.hourly_usd, od.hourly_usd)
        pairs += 1
    assert pairs > 5000


def test_provenance_has_one_record_per_spot_source_with_honest_counts(cat: Catalog, raw: dict[str, Any]) -> None:
    by_source = {p.source.split(":", 2)[2]: p for p in cat.provenance}
    assert set(by_source) == {"ec2_linux", "azure_linux", "azure_linux:lowpriority", "gce_instances",
                              "gce_instances:preemptible"}
    for src, p in by_source.items():
        sel = cat.src_code == cat.sources.index(p.source)
        caps = set(np.unique(cat.cap_code[sel]).tolist())
        assert caps == ({SPOT_CODE} if ":" in src else {0}), src
        assert p.offers == int(sel.sum()) > 0
    az_cells = sum(len(v) for v in raw["azure_linux"].values())
    az = by_source["azure_linux"], by_source["azure_linux:lowpriority"]
    assert sum(p.rows for p in az) == az_cells
    assert all(p.rows == p.offers + p.dropped for p in az)
    # GCE rows are rate cells (family x cpu/ram x region) of that kind; dropped cells priced no offer.
    gce = raw["gce_instances"]
    for src, kind in (("gce_instances", "on_demand"), ("gce_instances:preemptible", "preemptible")):
        p = by_source[src]
        cells = sum(len(part.get(kind) or {}) for f in gce.values() for part in f.values()
                    if isinstance(part, dict))
        used = set()
        for o in cat.offers(np.flatnonzero(cat.src_code == cat.sources.index(p.source))):
            fam = o.instance_type.name.split("-")[0]
            used.add((fam, "cpu", o.region))
            if fam not in ("f1", "g1"):
                used.add((fam, "ram", o.region))
        assert (p.rows, p.dropped) == (cells, cells - len(used)), src
        assert p.dropped >= 6 * 22  # the *_custom families are never composed


def test_duplicates_count_against_their_own_source_when_a_provider_has_two() -> None:
    b = CatalogBuilder(provenance=[Provenance("od", "2025-01-01", provider="azure"),
                                   Provenance("od:lowpriority", "2025-01-01", provider="azure")])
    for _ in range(3):  # the same spot offer three times: two duplicates, both of the spot source
        b.add(provider="azure", region="eastus", instance_type="X", vcpus=2, memory_gib=8, hourly_usd=0.02,
              capacity="spot", source="od:lowpriority")
    b.add(provider="azure", region="eastus", instance_type="X", vcpus=2, memory_gib=8, hourly_usd=0.1,
          source="od")
    got = {p.source: (p.offers, p.duplicates) for p in b.build().provenance}
    assert got == {"od": (1, 0), "od:lowpriority": (1, 2)}


def test_ec2_data_has_no_spot_so_the_embedded_catalog_has_no_aws_spot(cat: Catalog, raw: dict[str, Any]) -> None:
    ec2 = {k: json.dumps(v).lower() for k, v in raw.items() if k.startswith("ec2")}
    assert "ec2_linux" in ec2 and not [k for k, text in ec2.items() if "spot" in k or "spot" in text
                                       or "preemptible" in text]
    aws = cat.provider_code == cat.providers.index("aws")
    assert aws.any() and not (aws & (cat.cap_code == SPOT_CODE)).any()


def test_version_is_deterministic_and_covers_the_spot_rows(cat: Catalog) -> None:
    again = load_embedded(list_prices=False)
    assert again.version == cat.version
    assert np.array_equal(again.hourly_usd, cat.hourly_usd) and again.provenance == cat.provenance
    no_spot = cat.subset(np.flatnonzero(cat.cap_code != SPOT_CODE))
    assert no_spot.version != cat.version


def test_outlier_rule_reads_on_demand_prices_only(cat: Catalog) -> None:
    """Dropping every spot row changes no on-demand flag, and no spot row is flagged unless its on-demand
    twin is (the documented twin rule)."""
    flags = flag_outliers(cat)
    od = np.flatnonzero(cat.cap_code == 0)
    assert np.array_equal(flag_outliers(cat.subset(od)), flags[od])
    # A fake catalog where every spot price is absurdly low still flags nothing new.
    cols = {k: getattr(cat, k).copy() for k in ("loc_code", "zone_code", "type_code", "provider_code", "vcpus",
                                                 "memory_gib", "gpus", "gpu_memory_gib", "acc_code",
                                                 "arch_code", "cap_code", "hourly_usd", "outlier", "src_code")}
    cols["hourly_usd"][cols["cap_code"] == SPOT_CODE] = 1e-6
    cheap = Catalog(cols, locations=cat.locations, zones=cat.zones, type_names=cat.type_names,
                    providers=cat.providers, accelerators=cat.accelerators, sources=cat.sources,
                    provenance=cat.provenance)
    assert np.array_equal(flag_outliers(cheap), flags)


@pytest.mark.parametrize(
    ("vcpus", "mem"),
    [pytest.param(4, 16, id="4 vCPUs 16 GiB"), pytest.param(32, 256, id="32 vCPUs 256 GiB")],
)
def test_spot_required_places_on_the_cheapest_embedded_spot_offer_and_never_avoids_spot(
    cat: Catalog, vcpus: float, mem: float,
) -> None:
    eg = load_egress()
    req = make_request(vcpus=vcpus, memory_gib=mem, duration_hours=2, spot=SpotPolicy.REQUIRED)
    res = place(req, cat, eg, now=NOW, top=5)
    assert res.placement is not None and res.feasible > 0
    ok = (cat.vcpus >= vcpus) & (cat.memory_gib >= mem) & ~cat.outlier & (cat.arch_code == 0)  # amd64
    ok &= ~shared_core_rows(cat)  # whole-vCPU jobs: no burstable types
    brute = float(cat.hourly_usd[ok & (cat.cap_code == SPOT_CODE)].min())
    assert res.placement.capacity == Capacity.SPOT and res.placement.hourly_usd == pytest.approx(brute)
    assert all(o.capacity == Capacity.SPOT for o in res.alternatives)
    never = place(make_request(vcpus=vcpus, memory_gib=mem, duration_hours=2, spot=SpotPolicy.NEVER), cat, eg,
                  now=NOW, top=5)
    assert never.placement is not None
    assert all(o.capacity != Capacity.SPOT for o in (never.placement, *never.alternatives))
    assert never.rejected.get("SpotPolicy", 0) == int((cat.cap_code == SPOT_CODE).sum())
    cheapest_od = float(cat.hourly_usd[ok & (cat.cap_code != SPOT_CODE)].min())
    assert never.placement.hourly_usd == pytest.approx(cheapest_od)


@pytest.fixture
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("BROKER_DATA_DIR", str(tmp_path / "data"))
    for var in ("BROKER_CATALOG_DIR", "BROKER_INVENTORY", "BROKER_EGRESS_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    yield


@pytest.mark.parametrize(
    ("policy", "spot_expected"),
    [pytest.param("required", True, id="spot required places on embedded spot"),
     pytest.param("never", False, id="spot never never returns a spot offer")],
)
@pytest.mark.usefixtures("_isolated")
def test_broker_place_spot_policy_on_the_embedded_catalog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str, spot_expected: bool,
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "apiVersion: hybrid-broker/v1\nkind: Job\nmetadata: {name: spotty}\nspec:\n  command: [echo, hi]\n"
        '  resources:\n    requests: {cpu: "8", memory: 32Gi}\n'
        f"  placement: {{spot: {policy}, providers: [aws, azure, gcp]}}\n"
    )
    with pytest.raises(SystemExit) as exc:
        main(["place", str(spec), "--json", "--top", "5"])
    out = capsys.readouterr()
    assert exc.value.code in (0, None), out.err
    doc = json.loads(out.out)
    opts = [doc["placement"], *doc["alternatives"]]
    assert len(opts) > 1
    assert all((o["capacity"] == "spot") == spot_expected for o in opts)
    if spot_expected:
        assert {o["provider"] for o in opts} <= {"azure", "gcp"} and doc["rejected"]["SpotPolicy"] > 0
