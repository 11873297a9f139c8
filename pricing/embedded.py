"""The embedded default catalog, built from what Apache Libcloud ships inside its installed package.

Nothing is downloaded and no credentials are read: prices come from ``libcloud/data/pricing.json`` (dated by
its own ``updated`` field), specs from ``libcloud.compute.constants.ec2_instance_types`` and
``libcloud.compute.drivers.azure`` constants.

* **AWS** (``ec2_linux``): on-demand per type x region, full specs; GPU model by family (``p4d`` -> A100...);
  Graviton processors are arm64. A ``0.0`` cell is a gap in Libcloud's data (skipped, counted as dropped;
  the list-price table fills the gaps it knows). Libcloud's EC2 data has no spot prices (only on-demand
  Linux/RHEL/SUSE/Windows), so the embedded catalog has no AWS spot.
* **List prices** (``pricing/data/list-prices.csv``, dated per row with its source URL): merged over
  Libcloud's rows (see :func:`load_list_prices`); retired regions (:data:`RETIRED_REGIONS`) are dropped.
* **Price changes** (``pricing/data/price-changes.csv``, dated, with their source): an instance type whose
  list price changed after Libcloud's snapshot (AWS P4d/P4de/P5/P5en, cut up to 45% from 2025-06-01) keeps
  none of Libcloud's rows: a price known to be wrong is never shown or placed on. Those rows are counted
  as ``superseded``; the list-price table puts back the current price in the regions it states.
* **Azure** (``azure_linux``): sizes are bare lowercase names (``standardd2sv3``); vCPUs and memory come from
  the classic size table Libcloud ships (A0-A11, D1-D14) or are parsed from the name for the families whose
  name carries the vCPU count and whose memory per vCPU is fixed (Av2, B, D/Ds v2-v4, E v3/v4, F, Fs v2,
  L v2). ``lowpriority<size>`` keys (low-priority VMs, the predecessor of Azure Spot, billed the same way)
  are the ``spot`` price of the same size, with the same specs. GPU and irregular families are dropped
  (the SkyPilot Azure catalog covers them).
* **GCP** (``gce_instances``): per-vCPU and per-GiB rates per family; machine types are composed from
  GCE's published shapes (n1/n2/n2d/e2 standard/highmem/highcpu, c2-standard, m1, f1-micro, g1-small).
  ``preemptible`` rates compose the ``spot`` price of the same machine types exactly as ``on_demand``
  rates compose the on-demand one.

Provenance: one record per (provider, capacity) source, so ``broker catalog info`` shows spot rows apart:
``<tag>:ec2_linux``, ``<tag>:azure_linux`` (on-demand), ``<tag>:azure_linux:lowpriority`` (spot),
``<tag>:gce_instances`` (on-demand), ``<tag>:gce_instances:preemptible`` (spot). ``rows`` counts price cells
read (Azure/AWS: size x region; GCP: rate x region, per family, cpu and ram); ``dropped`` the cells that
yield no offer (zero price, unknown size, custom/uncomposed GCE families, a cpu rate without its ram rate).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from broker.errors import CatalogError, SpecError
from broker.model import Provenance
from pricing.catalog import Catalog, CatalogBuilder

__all__ = ["load_embedded", "libcloud_pricing_path", "load_list_prices", "load_price_changes", "PriceChange",
           "LIST_PRICES_PATH", "PRICE_CHANGES_PATH", "RETIRED_REGIONS", "EC2_ACCELERATORS", "SPOT_SOURCE_SUFFIX"]

LIST_PRICES_PATH = Path(__file__).parent / "data" / "list-prices.csv"
PRICE_CHANGES_PATH = Path(__file__).parent / "data" / "price-changes.csv"
LIST_PRICES_SOURCE = "list-prices.csv"
# Regions Libcloud still prices that no longer exist (Azure Germany sovereign cloud, closed 2021-10-29).
RETIRED_REGIONS: frozenset[str] = frozenset({"azure:germanycentral", "azure:germanynortheast"})

# EC2 family -> accelerator model (Libcloud gives the count, not the model).
EC2_ACCELERATORS = {
    "p2": "K80", "p3": "V100", "p3dn": "V100-32GB", "p4d": "A100", "p4de": "A100-80GB", "p5": "H100",
    "p5e": "H200", "p5en": "H200", "g3": "M60", "g3s": "M60", "g4dn": "T4", "g4ad": "Radeon-Pro-V520",
    "g5": "A10G", "g5g": "T4g", "g6": "L4", "gr6": "L4", "g6e": "L40S", "p6-b200": "B200", "g2": "K520",
}

_AZ_RE = re.compile(
    r"^(standard|basic|lowpriority)(ds|gs|dc|hb|hc|nc|nd|nv|pb|a|b|d|e|f|g|h|l|m)(\d+)([a-z]*?)(v(\d))?(promo)?$"
)
_B_SERIES = {  # name suffix -> (vCPUs, GiB) for the burstable B series
    "1ls": (1, 0.5), "1s": (1, 1), "1ms": (1, 2), "2s": (2, 4), "2ms": (2, 8), "4ms": (4, 16), "8ms": (8, 32),
    "12ms": (12, 48), "16ms": (16, 64), "20ms": (20, 80),
}
_DV2_SMALL = {1: 1, 2: 2, 3: 4, 4: 8, 5: 16}  # D1_v2..D5_v2: vCPUs, 3.5 GiB each
_DV2_MEM = {11: 2, 12: 4, 13: 8, 14: 16, 15: 20}  # D11_v2..D15_v2: vCPUs, 7 GiB each

# GCE shapes: family -> [(shape, GiB per vCPU, vCPU counts)]
_GCE_SHAPES: dict[str, list[tuple[str, float, tuple[int, ...]]]] = {
    "n1": [
        ("standard", 3.75, (1, 2, 4, 8, 16, 32, 64, 96)),
        ("highmem", 6.5, (2, 4, 8, 16, 32, 64, 96)),
        ("highcpu", 0.9, (2, 4, 8, 16, 32, 64, 96)),
    ],
    "n2": [
        ("standard", 4.0, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)),
        ("highmem", 8.0, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128)),
        ("highcpu", 1.0, (2, 4, 8, 16, 32, 48, 64, 80, 96)),
    ],
    "n2d": [
        ("standard", 4.0, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224)),
        ("highmem", 8.0, (2, 4, 8, 16, 32, 48, 64, 80, 96)),
        ("highcpu", 1.0, (2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224)),
    ],
    "e2": [
        ("standard", 4.0, (2, 4, 8, 16, 32)),
        ("highmem", 8.0, (2, 4, 8, 16)),
        ("highcpu", 1.0, (2, 4, 8, 16, 32)),
    ],
    "c2": [("standard", 4.0, (4, 8, 16, 30, 60))],
}
_GCE_FIXED = {  # name -> (family, vCPUs, GiB)
    "m1-megamem-96": ("m1", 96, 1433.6), "m1-ultramem-40": ("m1", 40, 961.0), "m1-ultramem-80": ("m1", 80, 1922.0),
    "m1-ultramem-160": ("m1", 160, 3844.0),
}
_GCE_SHARED = {"f1-micro": ("f1", 0.2, 0.6), "g1-small": ("g1", 0.5, 1.7)}  # priced per instance
# Azure sizes whose memory is not vCPUs x the family's GiB per vCPU (Azure's size tables): name -> GiB.
_AZ_MEMORY_GIB = {
    "Standard_E64_v3": 432.0, "Standard_E64s_v3": 432.0, "Standard_E64i_v3": 432.0, "Standard_E64is_v3": 432.0,
    "Standard_E64_v4": 504.0, "Standard_E64s_v4": 504.0, "Standard_E64d_v4": 504.0, "Standard_E64ds_v4": 504.0,
    "Standard_E96a_v4": 672.0, "Standard_E96as_v4": 672.0,
}
# Suffix of the source (and provenance record) of the spot rows of each Libcloud key; on-demand rows use
# the bare key. EC2 has none: Libcloud's EC2 data carries no spot prices.
SPOT_SOURCE_SUFFIX = {"azure_linux": "lowpriority", "gce_instances": "preemptible"}

# One loader's result per source: (source, rows read, rows dropped).
_Counts = list[tuple[str, int, int]]


# Design choice: ``import libcloud`` pulls in requests and urllib3 (~85 ms), a third of a cold catalog load,
# for data files only. The package directory is found without importing it, the EC2 constants module (no
# imports of its own) is executed from its file, and the Azure size table (a dict literal) is read with
# ``ast.literal_eval``; each falls back to the ordinary import when the layout is not what we expect.
_EC2_TYPES_FILE = ("compute", "constants", "ec2_instance_types.py")
_AZURE_DRIVER_FILE = ("compute", "drivers", "azure.py")
_VERSION_RE = re.compile(r'^__version__ = "([^"]+)"', re.MULTILINE)


def _libcloud_dir() -> Path:
    """The installed ``libcloud`` package directory (the package is not imported). ImportError if absent."""
    mod = sys.modules.get("libcloud")
    if mod is not None and getattr(mod, "__file__", None):
        return Path(str(mod.__file__)).parent
    spec = importlib.util.find_spec("libcloud")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("No module named 'libcloud'")
    return Path(list(spec.submodule_search_locations)[0])


def libcloud_pricing_path() -> Path:
    """Path of the ``pricing.json`` bundled in the installed Libcloud package."""
    return _libcloud_dir() / "data" / "pricing.json"


@lru_cache(maxsize=1)
def _libcloud_version() -> str:
    mod = sys.modules.get("libcloud")
    if mod is None:
        try:
            m = _VERSION_RE.search((_libcloud_dir() / "__init__.py").read_text())
        except OSError:
            m = None
        if m:
            return m.group(1)
    import libcloud

    return str(libcloud.__version__)


@lru_cache(maxsize=1)
def _ec2_instance_types() -> dict[str, Any]:
    """Libcloud's ``INSTANCE_TYPES`` (EC2 specs), executed from its file without importing ``libcloud``."""
    name = "libcloud.compute.constants.ec2_instance_types"
    mod = sys.modules.get(name)
    if mod is None:
        path = _libcloud_dir().joinpath(*_EC2_TYPES_FILE)
        spec = importlib.util.spec_from_file_location("_hybrid_broker_libcloud_ec2_types", path)
        if spec is not None and spec.loader is not None:
            mod = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(mod)
            except (OSError, ImportError, SyntaxError):
                mod = None
        if mod is None or not isinstance(getattr(mod, "INSTANCE_TYPES", None), dict):
            from libcloud.compute.constants.ec2_instance_types import INSTANCE_TYPES

            return INSTANCE_TYPES  # type: ignore[return-value]
    return mod.INSTANCE_TYPES  # type: ignore[no-any-return]


@lru_cache(maxsize=1)
def _azure_instance_types() -> dict[str, Any]:
    """Libcloud's ``AZURE_COMPUTE_INSTANCE_TYPES`` (classic Azure sizes), read as a literal from the driver's
    source without importing it."""
    mod = sys.modules.get("libcloud.compute.drivers.azure")
    if mod is None:
        try:
            src = _libcloud_dir().joinpath(*_AZURE_DRIVER_FILE).read_text()
            start = src.index("\nAZURE_COMPUTE_INSTANCE_TYPES = {") + 1
            end = src.index("\n}\n", start) + 2
            table = ast.literal_eval(src[start:end].partition("=")[2].strip())
            if isinstance(table, dict) and table:
                return table
        except (OSError, ValueError, SyntaxError):
            pass
    from libcloud.compute.drivers.azure import AZURE_COMPUTE_INSTANCE_TYPES

    return AZURE_COMPUTE_INSTANCE_TYPES  # type: ignore[no-any-return]


def load_embedded(pricing_path: str | Path | None = None, *, list_prices: bool = True) -> Catalog:
    """The embedded default catalog (AWS, Azure, GCP) from Libcloud's package data, retired regions dropped,
    with the repository's dated list-price table merged over it (``list_prices=False``: Libcloud's rows only).

    Raises :class:`CatalogError` when Libcloud or its data is missing or unreadable."""
    try:
        path = Path(pricing_path) if pricing_path else libcloud_pricing_path()
        data = json.loads(path.read_text())
    except (ImportError, OSError, ValueError) as exc:
        raise CatalogError(
            f"cannot read Libcloud's bundled pricing data: {exc}. To fix: pip install apache-libcloud"
        ) from exc
    updated = data.get("updated")
    date = datetime.fromtimestamp(float(updated), UTC).date().isoformat() if updated else ""
    compute = data.get("compute", {})
    b = CatalogBuilder()
    tag = f"libcloud-{_libcloud_version()}:pricing.json"
    for provider, key, fn in (
        ("aws", "ec2_linux", _ec2),
        ("azure", "azure_linux", _azure),
        ("gcp", "gce_instances", _gce),
    ):
        # offers are counted by build() per (provider, source).
        for source, rows, dropped in fn(b, compute.get(key, {}), f"{tag}:{key}"):
            b.provenance.append(Provenance(source=source, date=date, rows=rows, dropped=dropped,
                                           provider=provider))
    cat = b.build()
    if not list_prices:
        return cat
    return _without_superseded(cat, load_price_changes(), date).merged_with(load_list_prices())


@dataclass(frozen=True, slots=True)
class PriceChange:
    """A dated list-price change of one instance type (all regions) from ``price-changes.csv``."""

    provider: str
    instance_type: str
    capacity: str
    accelerator: str  # the GPU model of the type ("" for none): names it when a GPU query comes back empty
    effective: str
    source_url: str
    note: str


def load_price_changes(path: str | Path | None = None) -> list[PriceChange]:
    """The dated price changes the repository states (``pricing/data/price-changes.csv``). Raises
    :class:`CatalogError` naming the row for a bad cell."""
    import csv

    p = Path(path) if path else PRICE_CHANGES_PATH
    out: list[PriceChange] = []
    try:
        with p.open(newline="", encoding="utf-8") as f:
            for n, row in enumerate(csv.DictReader(f), start=2):
                try:
                    change = PriceChange(**{k: (row[k] or "").strip() for k in PriceChange.__dataclass_fields__})
                    datetime.fromisoformat(change.effective)
                    if change.capacity not in ("on-demand", "spot") or not change.source_url:
                        raise ValueError("capacity must be on-demand or spot, and source_url set")
                    if change.accelerator:
                        from broker.spec import normalize_accelerator

                        try:
                            change = replace(change, accelerator=normalize_accelerator(change.accelerator))
                        except SpecError as exc:
                            raise ValueError(exc.message) from None
                except (KeyError, ValueError, TypeError) as exc:
                    raise CatalogError(f"{p}:{n}: bad price-change row ({exc}). To fix: see the header") from None
                out.append(change)
    except OSError as exc:
        raise CatalogError(f"cannot read the price-change table {p}: {exc}") from exc
    return out


def _without_superseded(cat: Catalog, changes: list[PriceChange], date: str) -> Catalog:
    """``cat`` without the rows of every (provider, type, capacity) whose price changed after ``date`` (the
    data's own date), each dropped row counted as ``superseded`` on its source's provenance record."""
    import numpy as np

    drop = np.zeros(len(cat), dtype=bool)
    for ch in changes:
        if not date or ch.effective <= date or ch.provider not in cat.providers or \
                ch.instance_type not in cat.type_names:
            continue
        drop |= ((cat.provider_code == cat.providers.index(ch.provider))
                 & (cat.type_code == cat.type_names.index(ch.instance_type))
                 & (cat.cap_code == (1 if ch.capacity == "spot" else 0)))
    if not drop.any():
        return cat
    per_source = np.bincount(cat.src_code[drop], minlength=len(cat.sources))
    counted = {s: int(per_source[i]) for i, s in enumerate(cat.sources) if per_source[i]}
    kept = cat.subset(np.flatnonzero(~drop))
    return kept.with_provenance([replace(p, superseded=p.superseded + counted.get(p.source, 0))
                                 for p in kept.provenance])


def load_list_prices(path: str | Path | None = None) -> Catalog:
    """The dated list-price table the repository states (``pricing/data/list-prices.csv``: one offer per row
    with its ``source_url`` and ``as_of`` date). It fills Libcloud's gaps (a ``0.0`` cell there is a gap in
    Libcloud's data, not "not offered": m5.xlarge in us-east-1), corrects its stale rows (p4d.24xlarge after
    the 2025-06 price cut) and adds GPU offers of all three clouds; in :func:`load_embedded` it wins over
    Libcloud where both price an offer. Raises :class:`CatalogError` naming the row for a bad cell."""
    import csv

    p = Path(path) if path else LIST_PRICES_PATH
    b = CatalogBuilder()
    dates: list[str] = []
    try:
        with p.open(newline="", encoding="utf-8") as f:
            for n, row in enumerate(csv.DictReader(f), start=2):
                try:
                    b.add(provider=row["provider"], region=row["region"], instance_type=row["instance_type"],
                          capacity=row["capacity"], vcpus=float(row["vcpus"]), memory_gib=float(row["memory_gib"]),
                          gpus=int(row["gpus"] or 0), accelerator=row["accelerator"] or None,
                          gpu_memory_gib=float(row["gpu_memory_gib"] or 0), arch=row["arch"] or "amd64",
                          hourly_usd=float(row["usd_per_hour"]), source=LIST_PRICES_SOURCE)
                    datetime.fromisoformat(row["as_of"])
                    if not row["source_url"]:
                        raise ValueError("source_url is empty")
                except (KeyError, ValueError, TypeError) as exc:
                    raise CatalogError(f"{p}:{n}: bad list-price row ({exc}). To fix: see the header") from None
                dates.append(row["as_of"])
    except OSError as exc:
        raise CatalogError(f"cannot read the list-price table {p}: {exc}") from exc
    providers = sorted({loc.provider for loc in b._loc_objs})
    for prov in providers:
        b.provenance.append(Provenance(source=LIST_PRICES_SOURCE, date=max(dates) if dates else "", provider=prov))
    return b.build()


class _Bulk:
    """Offers of one provider and source, appended to the builder with one :meth:`CatalogBuilder.extend`
    call (in the order added, so codes and the catalog version are those of row-by-row ``add``)."""

    __slots__ = ("b", "provider", "source", "rows")

    def __init__(self, b: CatalogBuilder, provider: str, source: str) -> None:
        self.b, self.provider, self.source = b, provider, source
        self.rows: list[tuple[Any, ...]] = []

    def add(self, region: str, name: str, vcpus: float, mem: float, hourly: float, *, spot: bool = False,
            gpus: int = 0, acc: str | None = None, gmem: float = 0.0, arm: bool = False) -> None:
        self.rows.append((region, "", name, vcpus, mem, gpus, acc or "", gmem, arm, spot, hourly))

    def flush(self) -> None:
        if self.rows:
            keys = ("regions", "zones", "names", "vcpus", "memory_gib", "gpus", "accelerators", "gpu_memory_gib",
                    "arm", "spot", "hourly_usd")
            cols = {k: [r[i] for r in self.rows] for i, k in enumerate(keys)}
            self.b.extend(provider=self.provider, source=self.source, **cols)
            self.rows = []


def _mem_gib(s: str) -> float | None:
    m = re.match(r"^\s*([\d.,]+)\s*GiB", s or "")
    return float(m.group(1).replace(",", "")) if m else None


def _ec2(b: CatalogBuilder, prices: dict[str, dict[str, float]], source: str) -> _Counts:
    """On-demand EC2 offers (the only kind Libcloud's ``ec2_linux`` prices)."""
    INSTANCE_TYPES = _ec2_instance_types()  # noqa: N806

    out = _Bulk(b, "aws", source)
    rows = dropped = 0
    for name, by_region in prices.items():
        spec: Any = INSTANCE_TYPES.get(name)
        rows += len(by_region)
        if spec is None:
            dropped += len(by_region)
            continue
        extra = spec.get("extra", {})
        try:
            vcpus = float(extra.get("vcpu"))
        except (TypeError, ValueError):
            dropped += len(by_region)
            continue
        mem = _mem_gib(extra.get("memory", "")) or (spec.get("ram") or 0) / 1024.0
        gpu_s = str(extra.get("gpu") or "0")
        gpus = int(gpu_s) if gpu_s.isdigit() else 0
        family = name.split(".")[0]
        acc = EC2_ACCELERATORS.get(family) if gpus else None
        if gpus and acc is None:
            gpus = 0  # an accelerator Libcloud does not name (FPGA/Inferentia): offered as CPU capacity
        gmem_total = re.match(r"^\s*([\d.]+)\s*G", str(extra.get("gpuMemory") or ""))
        gmem = float(gmem_total.group(1)) / gpus if gmem_total and gpus else 0.0
        arch = "arm64" if "Graviton" in str(extra.get("physicalProcessor") or "") else "amd64"
        for region, price in by_region.items():
            if not price or price <= 0:
                dropped += 1
                continue
            out.add(region, name, vcpus, mem, float(price), gpus=gpus, acc=acc, gmem=gmem, arm=arch == "arm64")
    out.flush()
    return [(source, rows, dropped)]


def _azure_spec(fam: str, n: int, suffix: str, ver: str) -> tuple[float, float] | None:
    AZURE_COMPUTE_INSTANCE_TYPES = _azure_instance_types()  # noqa: N806

    if not ver and fam in ("a", "d", "ds") and (f"{'D' if fam == 'ds' else fam.upper()}{n}") in (
        AZURE_COMPUTE_INSTANCE_TYPES
    ) and not suffix:
        t: Any = AZURE_COMPUTE_INSTANCE_TYPES[f"{'D' if fam == 'ds' else fam.upper()}{n}"]
        cores = t["cores"]
        return (0.25 if cores == "Shared" else float(cores)), t["ram"] / 1024.0
    if fam == "b" and not ver:
        return _B_SERIES.get(f"{n}{suffix}")
    if fam in ("d", "ds") and ver == "2":
        if n in _DV2_SMALL:
            return float(_DV2_SMALL[n]), 3.5 * _DV2_SMALL[n]
        if n in _DV2_MEM:
            return float(_DV2_MEM[n]), 7.0 * _DV2_MEM[n]
        return None
    if fam == "a" and ver == "2":
        return float(n), (8.0 if "m" in suffix else 2.0) * n
    if fam == "d" and ver in ("3", "4"):
        return float(n), 4.0 * n
    if fam == "e" and ver in ("3", "4"):
        return float(n), 8.0 * n
    if fam == "f" and ver in ("", "2"):
        return float(n), 2.0 * n
    if fam == "l" and ver == "2":
        return float(n), 8.0 * n
    return None


def _azure_name(fam: str, n: int, suffix: str, ver: str) -> str:
    name = f"Standard_{fam.upper()}{n}{suffix}"
    return f"{name}_v{ver}" if ver else name


def _azure(b: CatalogBuilder, prices: dict[str, dict[str, float]], source: str) -> _Counts:
    """On-demand offers from ``standard*``/``basic*`` keys; spot offers (source ``<source>:lowpriority``)
    from ``lowpriority*`` keys, with the specs of the same size. Keys of unknown size are dropped."""
    spot_source = f"{source}:{SPOT_SOURCE_SUFFIX['azure_linux']}"
    counts = {source: [0, 0], spot_source: [0, 0]}  # source -> [rows, dropped]
    for key, by_region in prices.items():
        spot = key.startswith("lowpriority")
        src = spot_source if spot else source
        n = counts[src]
        n[0] += len(by_region)
        m = _AZ_RE.match(key)
        spec = _azure_spec(m.group(2), int(m.group(3)), m.group(4), m.group(6) or "") if m else None
        if m is None or spec is None or m.group(7):
            n[1] += len(by_region)
            continue
        kind, fam, size, suffix, ver = m.group(1), m.group(2), int(m.group(3)), m.group(4), m.group(6) or ""
        name = f"Basic_{fam.upper()}{size}" if kind == "basic" else _azure_name(fam, size, suffix, ver)
        vcpus, mem = spec[0], _AZ_MEMORY_GIB.get(name, spec[1])
        out = _Bulk(b, "azure", src)
        for region, price in by_region.items():
            if not price or price <= 0 or f"azure:{region}" in RETIRED_REGIONS:  # a gap, or a closed region
                n[1] += 1
                continue
            out.add(region, name, vcpus, mem, float(price), spot=spot)
        out.flush()
    return [(src, rows, dropped) for src, (rows, dropped) in counts.items()]


def _rates(fam: dict[str, Any], part: str, kind: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for region, v in (fam.get(part, {}).get(kind) or {}).items():
        p = v.get("price") if isinstance(v, dict) else v
        if isinstance(p, int | float) and p > 0:
            out[region] = float(p)
    return out


def _gce(b: CatalogBuilder, families: dict[str, Any], source: str) -> _Counts:
    """Machine types composed from per-family rates: ``vCPUs x cpu rate + GiB x ram rate`` per region where
    both rates are priced (f1-micro/g1-small: the ``cpu`` rate is the instance price). ``on_demand`` rates
    give on-demand offers, ``preemptible`` rates spot offers (source ``<source>:preemptible``).

    Rows are the positive-or-zero rate cells (family x cpu/ram x region) of that kind; a cell is dropped
    when no offer uses it (zero price, a family without published shapes such as ``*_custom``, or a region
    priced for cpu but not ram)."""
    shapes: list[tuple[str, str, float, float]] = []  # (name, family, vcpus, GiB)
    for fam, defs in _GCE_SHAPES.items():
        for shape, per, counts in defs:
            for n in counts:
                shapes.append((f"{fam}-{shape}-{n}", fam, float(n), round(per * n, 2)))
    shapes.extend((name, fam, float(v), m) for name, (fam, v, m) in _GCE_FIXED.items())
    out: _Counts = []
    for spot, kind, src in ((False, "on_demand", source),
                            (True, "preemptible", f"{source}:{SPOT_SOURCE_SUFFIX['gce_instances']}")):
        bulk = _Bulk(b, "gcp", src)
        rows = sum(len(part.get(kind) or {}) for f in families.values() if isinstance(f, dict)
                   for part in f.values() if isinstance(part, dict))
        used: set[tuple[str, str, str]] = set()  # (family, part, region) cells that priced an offer
        for name, fam, vcpus, mem in shapes:
            f = families.get(fam)
            if not f:
                continue
            cpu, ram = _rates(f, "cpu", kind), _rates(f, "ram", kind)
            for region in sorted(set(cpu) & set(ram)):
                used.update(((fam, "cpu", region), (fam, "ram", region)))
                bulk.add(region, name, vcpus, mem, round(vcpus * cpu[region] + mem * ram[region], 6), spot=spot)
        for name, (fam, vcpus, mem) in _GCE_SHARED.items():
            f = families.get(fam)
            if not f:
                continue
            for region, price in _rates(f, "cpu", kind).items():
                used.add((fam, "cpu", region))
                bulk.add(region, name, vcpus, mem, price, spot=spot)
        bulk.flush()
        out.append((src, rows, rows - len(used)))
    return out
