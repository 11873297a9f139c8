"""Builders shared by the pricing and placement tests: tiny synthetic catalogs and requests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from broker.model import Capacity, DataInput, InstanceType, Location, Offer, Provenance, Request, SiteKind
from pricing import Catalog, load_catalog
from pricing.geo import continent_of

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
SKY_V8 = SHARED / "catalogs" / "skypilot" / "v8"


def make_offer(
    price: float = 1.0,
    *,
    provider: str = "aws",
    region: str = "us-east-1",
    zone: str | None = None,
    name: str = "m.large",
    vcpus: float = 2,
    memory_gib: float = 8,
    gpus: int = 0,
    accelerator: str | None = None,
    arch: str = "amd64",
    capacity: Capacity = Capacity.ON_DEMAND,
) -> Offer:
    site = SiteKind(provider) if provider in ("onprem", "edge") else SiteKind.CLOUD
    loc = Location(provider, region, zone, site, continent_of(provider, region))
    it = InstanceType(name, vcpus, memory_gib, gpus, accelerator, arch=arch)
    return Offer(it, loc, capacity, price, source="test")


def make_catalog(offers: list[Offer]) -> Catalog:
    return Catalog.from_offers(offers, Provenance(source="test", date="2026-01-01", provider=""))


def make_request(name: str = "job", vcpus: float = 1, memory_gib: float = 1, **kw: object) -> Request:
    return Request(name=name, vcpus=vcpus, memory_gib=memory_gib, **kw)  # type: ignore[arg-type]


def shared_core_rows(cat: Catalog) -> np.ndarray:
    """Rows of burstable families (AWS t*, Azure B-series, GCP shared-core), written independently of the
    burstable plugin: whole-vCPU requests never get them."""
    shared_type = np.array([
        n.startswith(("t1.", "t2.", "t3.", "t3a.", "t4g.")) or n in ("e2-micro", "e2-small", "e2-medium",
                                                                       "f1-micro", "g1-small")
        or (n.startswith("Standard_B") and n[10:11].isdigit()) for n in cat.type_names], dtype=bool)
    return shared_type[cat.type_code]



def spot_risk_factor(cat: Catalog, req: Request, paid_hours: float | np.ndarray) -> np.ndarray:
    """Per row: 1 + the expected interruption cost / compute of a spot row under the default band (5-10% a
    month, midpoint 7.5%: -ln(1 - 0.075) / 730 per hour), N nodes each losing half the run plus 0.1 h per
    interruption; 1 for other capacity. Written independently of pricing/interruption.py."""
    import math

    rate = -math.log(1 - 0.075) / 730
    spot = (cat.cap_code == 1) & (req.spot != "never")
    return 1.0 + np.where(spot, req.nodes * rate * (np.asarray(paid_hours) / 2 + 0.1), 0.0)


def data(location: str, size_gib: float) -> DataInput:
    return DataInput(uri=f"s3://bucket/{location}", location=location, size_gib=size_gib)


def write_csv(path: Path, header: str, rows: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="session")
def real_catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Catalog]:
    """Embedded + the shared SkyPilot v8 catalogs (skips when ../shared is absent); cache in a temp dir."""
    if not (SKY_V8 / "gcp" / "vms.csv").is_file():
        pytest.skip("../shared/catalogs/skypilot/v8 is not present on this machine")
    old = os.environ.get("BROKER_DATA_DIR")
    os.environ["BROKER_DATA_DIR"] = str(tmp_path_factory.mktemp("hb-data"))
    try:
        yield load_catalog(SKY_V8)
    finally:
        if old is None:
            os.environ.pop("BROKER_DATA_DIR", None)
        else:
            os.environ["BROKER_DATA_DIR"] = old
