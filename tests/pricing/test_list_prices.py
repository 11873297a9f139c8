"""The embedded default against the repository's dated public list prices (pricing/data/list-prices.csv),
and those list prices against the independent SkyPilot v8 catalog when ../shared holds it."""

from __future__ import annotations

import csv
from datetime import date
from pathlib import Path

import pytest

from broker.model import Capacity
from pricing import Catalog, load_catalog
from pricing.embedded import (
    LIST_PRICES_PATH,
    PRICE_CHANGES_PATH,
    RETIRED_REGIONS,
    load_embedded,
    load_list_prices,
    load_price_changes,
)
from tests.pricing.catalog_builders import real_catalog  # noqa: F401

ROWS = list(csv.DictReader(LIST_PRICES_PATH.open(newline="")))


def _key(provider: str, region: str, itype: str, capacity: str) -> tuple[str, str, str]:
    return (f"{provider}:{region}", itype, capacity)


def _prices(cat: Catalog, source_prefix: str = "") -> dict[tuple[str, str, str], list[tuple[float, bool]]]:
    import numpy as np

    out: dict[tuple[str, str, str], list[tuple[float, bool]]] = {}
    listed = [c for c, t in enumerate(cat.type_names) if t in {r["instance_type"] for r in ROWS}]
    for i in np.flatnonzero(np.isin(cat.type_code, listed)):  # only the listed types: a few hundred rows
        if source_prefix and not cat.sources[int(cat.src_code[i])].startswith(source_prefix):
            continue
        k = (cat.locations[int(cat.loc_code[i])].key, cat.type_names[int(cat.type_code[i])],
             "spot" if cat.cap_code[i] == 1 else "on-demand")
        out.setdefault(k, []).append((float(cat.hourly_usd[i]), bool(cat.outlier[i])))
    return out


@pytest.fixture(scope="module")
def embedded() -> Catalog:
    return load_embedded()


def test_the_table_is_dated_sourced_and_spans_types_regions_capacities_and_clouds() -> None:
    assert len(ROWS) >= 30
    assert {r["provider"] for r in ROWS} == {"aws", "azure", "gcp"}
    assert {r["capacity"] for r in ROWS} == {"on-demand", "spot"}
    assert len({(r["provider"], r["region"]) for r in ROWS}) >= 8
    assert len({r["instance_type"] for r in ROWS}) >= 30
    assert {r["provider"] for r in ROWS if int(r["gpus"])} == {"aws", "azure", "gcp"}
    for r in ROWS:
        assert r["source_url"] and date.fromisoformat(r["as_of"]) <= date.today()
    assert len({_key(r["provider"], r["region"], r["instance_type"], r["capacity"]) for r in ROWS}) == len(ROWS)


def test_every_listed_offer_is_in_the_embedded_default_within_1_percent(embedded: Catalog) -> None:
    got = _prices(embedded)
    for r in ROWS:
        k = _key(r["provider"], r["region"], r["instance_type"], r["capacity"])
        ref = float(r["usd_per_hour"])
        assert k in got, f"{k} is missing from the embedded catalog"
        for price, outlier in got[k]:
            assert abs(price - ref) <= 0.01 * ref, (k, price, ref)
            assert not outlier, k


def test_libcloud_gaps_stale_rows_and_retired_regions_are_fixed(embedded: Catalog) -> None:
    got = _prices(embedded)
    raw = _prices(load_embedded(list_prices=False))
    for itype in ("m5.xlarge", "t3.medium", "r5.xlarge"):  # 0.0 cells in Libcloud's us-east-1 data
        assert ("aws:us-east-1", itype, "on-demand") not in raw
        assert ("aws:us-east-1", itype, "on-demand") in got
    assert raw[("aws:us-east-1", "p4d.24xlarge", "on-demand")][0][0] == pytest.approx(36.05, abs=0.01)
    assert got[("aws:us-east-1", "p4d.24xlarge", "on-demand")] == [(21.96, False)]  # after the 2025-06 cut
    assert not {loc.key for loc in embedded.locations} & RETIRED_REGIONS
    for provider in ("aws", "azure", "gcp"):  # GPUs on all three clouds
        assert embedded.query(gpus=1, providers=[provider]).size > 0
    for provider in ("azure", "gcp"):  # spot where the embedded sources publish it (AWS: no list price)
        assert embedded.query(providers=[provider], capacities=[Capacity.SPOT.value]).size > 0
    dated = {p.source: p.date for p in embedded.provenance}
    assert dated["list-prices.csv"] == max(r["as_of"] for r in ROWS)


def test_on_demand_list_prices_agree_with_the_skypilot_v8_catalog_within_1_percent(
    real_catalog: Catalog,  # noqa: F811 - embedded + v8 (skips without ../shared); v8 rows win where both price
) -> None:
    sky = _prices(real_catalog, "skypilot-v8:")
    compared = 0
    for r in ROWS:
        k = _key(r["provider"], r["region"], r["instance_type"], r["capacity"])
        if r["capacity"] != "on-demand" or k not in sky:  # spot prices move daily: dated snapshots only
            continue
        ref = float(r["usd_per_hour"])
        assert all(abs(p - ref) <= 0.01 * ref for p, _ in sky[k]), (k, ref, sky[k])
        compared += 1
    assert compared >= 20


def test_a_bad_row_names_the_line(tmp_path: Path) -> None:
    from broker.errors import CatalogError

    bad = tmp_path / "prices.csv"
    lines = LIST_PRICES_PATH.read_text().splitlines()
    bad.write_text("\n".join([lines[0], lines[1].replace(",0.096,", ",cheap,")]) + "\n")
    with pytest.raises(CatalogError, match=r"prices.csv:2: bad list-price row"):
        load_list_prices(bad)


def test_placement_over_the_default_catalog_finds_the_listed_m5_xlarge(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROKER_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("BROKER_CATALOG_DIR", raising=False)
    cat = load_catalog()
    idx = cat.query(providers=["aws"], regions=["us-east-1"], min_vcpus=4, min_memory_gib=16)
    names = {cat.type_names[int(cat.type_code[i])]: float(cat.hourly_usd[i]) for i in idx}
    assert names["m5.xlarge"] == 0.192


CHANGES = list(csv.DictReader(PRICE_CHANGES_PATH.open(newline="")))


def test_a_price_changed_after_libcloud_s_snapshot_is_never_shown_from_libcloud(embedded: Catalog) -> None:
    """AWS cut P4d/P4de/P5/P5en prices from 2025-06-01: Libcloud's 2025-03-02 rows of those types are left
    out in every region (counted as superseded), and only the list-price table's current rows remain."""
    raw = load_embedded(list_prices=False)
    libcloud_date = next(p.date for p in raw.provenance if p.provider == "aws")
    changed = {(c["provider"], c["instance_type"], c["capacity"]) for c in CHANGES if c["effective"] > libcloud_date}
    assert {t for _, t, _ in changed} >= {"p4d.24xlarge", "p5.48xlarge"}
    listed = {(r["provider"], r["region"], r["instance_type"], r["capacity"]) for r in ROWS}
    got, before = _prices_of(embedded, changed), _prices_of(raw, changed)
    assert len(before) > len(got)  # Libcloud prices them in many regions; eu-west-1 p4d at $35.40 among them
    assert _prices(raw)[("aws:eu-west-1", "p4d.24xlarge", "on-demand")][0][0] == pytest.approx(35.3965, abs=1e-3)
    assert ("aws:eu-west-1", "p4d.24xlarge", "on-demand") not in got
    for (loc, itype, cap), srcs in got.items():
        provider, region = loc.split(":", 1)
        assert (provider, region, itype, cap) in listed and srcs == {"list-prices.csv"}, (loc, itype, srcs)
    superseded = sum(p.superseded for p in embedded.provenance if p.source.endswith("ec2_linux"))
    assert superseded == len(before)  # one Libcloud row per (region, type): every one of them counted


def _prices_of(cat: Catalog, changed: set[tuple[str, str, str]]) -> dict[tuple[str, str, str], set[str]]:
    out: dict[tuple[str, str, str], set[str]] = {}
    for i in range(len(cat)):
        prov = cat.providers[int(cat.provider_code[i])]
        itype = cat.type_names[int(cat.type_code[i])]
        cap = "spot" if cat.cap_code[i] == 1 else "on-demand"
        if (prov, itype, cap) in changed:
            out.setdefault((cat.locations[int(cat.loc_code[i])].key, itype, cap), set()).add(
                cat.sources[int(cat.src_code[i])])
    return out


def test_the_price_change_table_is_dated_and_sourced_and_a_bad_row_names_its_line(tmp_path: Path) -> None:
    from broker.errors import CatalogError

    assert CHANGES and all(c["source_url"] and date.fromisoformat(c["effective"]) <= date.today() for c in CHANGES)
    assert [c.instance_type for c in load_price_changes()] == [c["instance_type"] for c in CHANGES]
    bad = tmp_path / "changes.csv"
    lines = PRICE_CHANGES_PATH.read_text().splitlines()
    bad.write_text("\n".join([lines[0], lines[1].replace(",2025-06-01,", ",June,")]) + "\n")
    with pytest.raises(CatalogError, match=r"changes.csv:2: bad price-change row"):
        load_price_changes(bad)
    bad.write_text("\n".join([lines[0], lines[1].replace(",A100,", ",A1000,")]) + "\n")
    with pytest.raises(CatalogError, match=r"changes.csv:2: bad price-change row .*unknown accelerator 'A1000'"):
        load_price_changes(bad)


def test_a_superseded_type_of_any_provider_is_named_by_its_accelerator_column(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The empty-query hint reads the accelerator from the dated table, not from one cloud's family names."""
    import pricing.embedded as embedded
    from broker.cli.catalog import _superseded_types

    table = tmp_path / "changes.csv"
    table.write_text("provider,instance_type,capacity,accelerator,effective,source_url,note\n"
                     "gcp,a3-highgpu-8g,on-demand,h100,2026-01-01,https://cloud.google.com/compute/gpus-pricing,x\n"
                     "gcp,n2-standard-8,on-demand,,2026-01-01,https://cloud.google.com/compute/all-pricing,x\n")
    changes = load_price_changes(table)
    assert [c.accelerator for c in changes] == ["H100", ""]
    monkeypatch.setattr(embedded, "load_price_changes", lambda path=None: changes)

    class Cat:
        provenance = [type("P", (), {"provider": "gcp", "superseded": 2})()]

    assert _superseded_types(Cat(), "gcp", "H100", "on-demand") == ["a3-highgpu-8g"]
    assert _superseded_types(Cat(), "gcp", None, "on-demand") == ["a3-highgpu-8g", "n2-standard-8"]
    assert _superseded_types(Cat(), "gcp", "A100", "on-demand") == []
