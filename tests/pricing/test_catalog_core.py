"""The columnar Catalog: dedup, outlier rule, queries, merge precedence, versions, persistence."""

from __future__ import annotations

import numpy as np
import pytest

from broker.errors import NotFoundError
from broker.model import Capacity, Provenance
from pricing import Catalog, CatalogStore
from pricing.skypilot import load_skypilot_dir
from tests.pricing.catalog_builders import make_catalog, make_offer


def test_rows_are_sorted_by_price_and_offer_round_trips() -> None:
    offers = [make_offer(3.0, name="c"), make_offer(1.0, name="a"), make_offer(2.0, name="b", zone="us-east-1a")]
    cat = make_catalog(offers)
    assert len(cat) == 3
    assert list(cat.hourly_usd) == [1.0, 2.0, 3.0]
    back = cat.offers(range(3))
    assert [o.instance_type.name for o in back] == ["a", "b", "c"]
    assert back[1].location.zone == "us-east-1a" and back[0].location.zone is None
    assert back[0].location.continent == "na"


def test_duplicate_keys_are_merged_first_wins_and_counted() -> None:
    offers = [make_offer(1.0), make_offer(9.0), make_offer(1.0, capacity=Capacity.SPOT)]
    cat = make_catalog(offers)
    assert len(cat) == 2
    assert sorted(cat.hourly_usd.tolist()) == [1.0, 1.0]


def test_outlier_rule_flags_on_demand_below_half_the_median_and_its_spot_twin() -> None:
    prices = [0.30, 0.25, 0.35, 0.28, 0.0449]
    regions = ["eastus", "westus", "westeurope", "japaneast", "newzealandnorth"]
    offers = [make_offer(p, provider="azure", region=r, name="Standard_F4ams_v6") for p, r in zip(prices, regions,
                                                                                                   strict=True)]
    offers.append(make_offer(0.01, provider="azure", region="newzealandnorth", name="Standard_F4ams_v6",
                             capacity=Capacity.SPOT))
    offers.append(make_offer(0.02, provider="azure", region="eastus", name="Standard_F4ams_v6",
                             capacity=Capacity.SPOT))
    cat = make_catalog(offers)
    flagged = {(cat.offer(int(i)).region, cat.offer(int(i)).capacity.value) for i in np.flatnonzero(cat.outlier)}
    assert flagged == {("newzealandnorth", "on-demand"), ("newzealandnorth", "spot")}
    assert len(cat.query()) == len(cat) - 2
    assert len(cat.query(include_outliers=True)) == len(cat)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, {"small", "big", "gpu", "arm", "spot-small", "gcp-small"}),
        ({"min_vcpus": 8}, {"big", "gpu"}),
        ({"min_memory_gib": 30}, {"big", "gpu"}),
        ({"gpus": 1}, {"gpu"}),
        ({"accelerator": "a100"}, {"gpu"}),
        ({"accelerator": "H100"}, set()),
        ({"arch": "arm64"}, {"arm"}),
        ({"providers": ["gcp"]}, {"gcp-small"}),
        ({"regions": ["eu-west-1"]}, {"big"}),
        ({"regions": ["aws:eu-west-1"]}, {"big"}),
        ({"capacities": ["spot"]}, {"spot-small"}),
        ({"max_hourly_usd": 0.5}, {"small", "arm", "spot-small", "gcp-small"}),
    ],
    ids=[
        "no filter returns everything",
        "min vcpus keeps the big machines",
        "min memory keeps the big machines",
        "a gpu count keeps gpu machines",
        "accelerator matches case-insensitively",
        "an accelerator nobody offers returns nothing",
        "arch arm64 keeps graviton",
        "provider allow-list",
        "region allow-list by name",
        "region allow-list by location key",
        "capacity spot",
        "price cap",
    ],
)
def test_query_filters(kwargs: dict[str, object], expected: set[str]) -> None:
    cat = make_catalog([
        make_offer(0.1, name="small"),
        make_offer(2.0, name="big", region="eu-west-1", vcpus=16, memory_gib=64),
        make_offer(30.0, name="gpu", vcpus=96, memory_gib=1152, gpus=8, accelerator="A100"),
        make_offer(0.08, name="arm", arch="arm64"),
        make_offer(0.03, name="spot-small", capacity=Capacity.SPOT),
        make_offer(0.12, name="gcp-small", provider="gcp", region="us-central1"),
    ])
    got = {cat.offer(int(i)).instance_type.name for i in cat.query(**kwargs)}  # type: ignore[arg-type]
    assert got == expected


def test_merged_with_lets_the_other_catalog_win_also_over_zone_less_rows() -> None:
    base = make_catalog([make_offer(1.0, name="a"), make_offer(5.0, name="b")])
    loaded = make_catalog([make_offer(0.7, name="a", zone="use1-az1"), make_offer(4.0, name="b"),
                           make_offer(3.0, name="c")])
    merged = base.merged_with(loaded)
    by_name = {(o.instance_type.name, o.location.zone): o.hourly_usd for o in merged.offers(range(len(merged)))}
    assert by_name == {("a", "use1-az1"): 0.7, ("b", None): 4.0, ("c", None): 3.0}


def test_version_is_stable_for_identical_inputs_and_changes_with_a_price() -> None:
    a = make_catalog([make_offer(1.0), make_offer(2.0, name="x")])
    b = make_catalog([make_offer(1.0), make_offer(2.0, name="x")])
    c = make_catalog([make_offer(1.0), make_offer(2.5, name="x")])
    assert a.version == b.version
    assert a.version != c.version
    assert a.version.startswith("2026-01-01-")


def test_npz_round_trip_keeps_everything(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cat = make_catalog([make_offer(1.0), make_offer(2.0, name="g", gpus=1, accelerator="T4", zone="z1")])
    cat.save_npz(tmp_path / "c.npz")
    back = Catalog.load_npz(tmp_path / "c.npz")
    assert back.version == cat.version
    assert back.offers(range(len(back))) == cat.offers(range(len(cat)))
    assert back.provenance == cat.provenance


def test_to_skypilot_csv_round_trips_through_the_loader(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cat = make_catalog([
        make_offer(1.0, name="m5.large", zone="use1-az1"),
        make_offer(0.3, name="m5.large", zone="use1-az1", capacity=Capacity.SPOT),
        make_offer(0.5, provider="azure", region="eastus", name="Standard_D2s_v3"),
        make_offer(3.0, provider="gcp", region="us-central1", zone="us-central1-a", name="a2-highgpu-1g",
                   gpus=1, accelerator="A100", vcpus=12, memory_gib=85),
    ])
    cat.to_skypilot_csv(tmp_path)
    back = load_skypilot_dir(tmp_path)
    key = {(o.provider, o.region, o.instance_type.name, o.capacity.value, o.hourly_usd) for o in
           back.offers(range(len(back)))}
    assert key == {(o.provider, o.region, o.instance_type.name, o.capacity.value, o.hourly_usd) for o in
                   cat.offers(range(len(cat)))}


def test_catalog_store_keeps_every_version(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = CatalogStore(tmp_path)
    assert store.current() is None and store.versions() == []
    v1 = store.save(make_catalog([make_offer(1.0)]), "bundled")
    v2 = store.save(make_catalog([make_offer(2.0)]), "refresh aws")
    assert store.save(make_catalog([make_offer(1.0)]), "again") == v1  # idempotent by content
    assert [v for v, _, _ in store.versions()] == [v1, v2]
    assert store.current() == v2
    assert store.load(v1).hourly_usd.tolist() == [1.0]
    with pytest.raises(NotFoundError):
        store.load("2026-01-01-000000000000")
    with pytest.raises(NotFoundError):
        store.load("../etc/passwd")


def test_from_offers_records_provenance_counts() -> None:
    cat = Catalog.from_offers([make_offer(1.0), make_offer(1.0)], Provenance("unit", "2026-02-02", provider="aws"))
    (p,) = cat.provenance
    assert p.duplicates == 1 and p.offers == 1 and p.source == "unit"
