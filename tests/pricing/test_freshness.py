"""Prices older than 30 days are flagged, per cloud, with the way to be current."""

from __future__ import annotations

from datetime import date

from broker.model import Provenance
from pricing import Catalog
from pricing.freshness import stale_providers, stale_warning
from tests.pricing.catalog_builders import make_offer


def _cat(dates: dict[str, str]) -> Catalog:
    from pricing.catalog import CatalogBuilder

    b = CatalogBuilder(provenance=[Provenance(source=f"s-{p}", date=d, provider=p) for p, d in dates.items()])
    for p in dates:
        o = make_offer(1.0, provider=p, region={"aws": "us-east-1", "azure": "eastus", "gcp": "us-central1"}[p])
        b.add(provider=p, region=o.region, instance_type="x", vcpus=1, memory_gib=1, hourly_usd=1.0,
              source=f"s-{p}")
    return b.build()


def test_each_cloud_is_judged_by_its_newest_source() -> None:
    cat = _cat({"aws": "2025-06-15", "azure": "2026-11-20", "gcp": ""})
    today = date(2026, 12, 3)
    assert stale_providers(cat, today=today) == [("aws", "2025-06-15", 536), ("gcp", "undated", -1)]
    w = stale_warning(cat, today=today)
    assert w is not None and "aws 2025-06-15 (536 days)" in w and "broker catalog refresh" in w
    assert "azure" not in w
    assert stale_warning(_cat({"aws": "2026-11-20"}), today=today) is None
