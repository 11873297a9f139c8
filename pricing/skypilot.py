"""Loader for price catalogs in SkyPilot's v8 CSV layout: ``DIR/<provider>/vms.csv``.

Conventions understood (headers differ per cloud; columns are found by name):

* ``Price`` is the on-demand and ``SpotPrice`` the spot USD/hour of one VM; empty or ``0.0`` means that
  capacity is not offered there. A row with neither price is dropped.
* GCP lists GPUs as separate rows with an empty ``InstanceType`` (price for ``AcceleratorCount`` GPUs). They
  combine with hosts in the same zone: A2/A3/A4/G2 machine types carry fixed GPUs (``a2-highgpu-8g`` =
  8 x A100; its host row prices only vCPUs and memory), N1 types take T4/P4/V100/P100/K80 up to a vCPU and
  memory limit per GPU count; such offers are named ``<host>+<ACC>:<N>`` (``n1-standard-8+T4:1``).
  A host row that names its accelerator itself is a whole GPU VM (price includes the GPUs).
  TPU rows, GPU hosts without a GPU price in their zone, fractional GPU counts and unparsable rows are
  dropped and counted.
* Identical keys (provider, region, zone, type, capacity) are merged: the first row wins.
* Arch: AWS ``Arch`` column; Azure sizes with a ``p`` in their feature letters (``D2ps_v5``); GCP ``t2a``/
  ``c4a``/``n4a`` families are arm64.
"""

from __future__ import annotations

import csv
import math
import operator
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from broker.errors import CatalogError
from broker.model import Provenance
from pricing.catalog import Catalog, CatalogBuilder

__all__ = ["load_skypilot_dir", "load_skypilot_csv", "skypilot_files", "SKYPILOT_PROVIDERS"]

SKYPILOT_PROVIDERS = ("aws", "azure", "gcp")

_GPU_MEM_RE = re.compile(r"SizeInMiB'?\"?:\s*(\d+)")
_AZURE_ARM_RE = re.compile(r"^Standard_[A-Z]+\d+[a-z]*p[a-z]*_", re.IGNORECASE)
_GCP_ARM_PREFIX = ("t2a-", "c4a-", "n4a-")

# GCP machine types whose GPUs are part of the machine type (host row + GPU row = one offer).
_GCP_FIXED = (
    (re.compile(r"^a2-highgpu-(\d+)g$"), "A100", None),
    (re.compile(r"^a2-megagpu-(\d+)g$"), "A100", None),
    (re.compile(r"^a2-ultragpu-(\d+)g$"), "A100-80GB", None),
    (re.compile(r"^a3-highgpu-(\d+)g$"), "H100", None),
    (re.compile(r"^a3-megagpu-(\d+)g$"), "H100-MEGA", None),
    (re.compile(r"^a3-edgegpu-(\d+)g(-nolssd)?$"), "H100", None),
    (re.compile(r"^a3-ultragpu-(\d+)g(-nolssd)?$"), "H200", None),
    (re.compile(r"^a4-highgpu-(\d+)g$"), "B200", None),
)
_G2_L4 = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}
# N1 hosts that take attachable GPUs: {acc: {count: (max vCPUs, max memory GiB)}} (GCP's published limits).
_N1_LIMITS: dict[str, dict[int, tuple[float, float]]] = {
    "T4": {1: (48, 312), 2: (48, 312), 4: (96, 624)},
    "P4": {1: (24, 156), 2: (48, 312), 4: (96, 624)},
    "V100": {1: (12, 78), 2: (24, 156), 4: (48, 312), 8: (96, 624)},
    "P100": {1: (16, 104), 2: (32, 208), 4: (96, 624)},
    "K80": {1: (8, 52), 2: (16, 104), 4: (32, 208), 8: (64, 416)},
}


@dataclass
class _Counts:
    rows: int = 0
    dropped: int = 0
    duplicates: int = 0


class _Cols:
    """Offer rows for CatalogBuilder.extend, collected as tuples and transposed once at the end."""

    _KEYS = ("regions", "zones", "names", "vcpus", "memory_gib", "gpus", "accelerators", "gpu_memory_gib", "arm",
             "spot", "hourly_usd")

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def add(self, od: float | None, spot: float | None, *row: Any) -> bool:
        """Append the on-demand and/or spot offer of ``row`` (region, zone, name, vcpus, memory, gpus,
        accelerator, gpu memory, arm); False when neither price is offered."""
        if od is not None:
            self.rows.append((*row, False, od))
        if spot is not None:
            self.rows.append((*row, True, spot))
        return od is not None or spot is not None

    @property
    def cols(self) -> dict[str, Any]:
        # One C-level pass per column (zip(*rows) over ~90k rows is twice as slow).
        return {k: list(map(operator.itemgetter(i), self.rows)) for i, k in enumerate(self._KEYS)}


def skypilot_files(catalog_dir: str | Path) -> list[tuple[str, Path]]:
    """``(provider, path)`` of every ``<dir>/<provider>/vms.csv`` we understand, sorted by provider."""
    d = Path(catalog_dir).expanduser()
    if not d.is_dir():
        raise CatalogError(
            f"catalog directory {d} does not exist. To fix: point --catalog/BROKER_CATALOG_DIR at a directory "
            "holding <provider>/vms.csv (SkyPilot v8 layout)"
        )
    files = [(p, d / p / "vms.csv") for p in SKYPILOT_PROVIDERS if (d / p / "vms.csv").is_file()]
    if not files:
        raise CatalogError(
            f"catalog directory {d} holds no aws/, azure/ or gcp/ vms.csv. To fix: use the v8 layout "
            "<dir>/<provider>/vms.csv"
        )
    return files


def load_skypilot_dir(catalog_dir: str | Path) -> Catalog:
    """Every provider's ``vms.csv`` under ``catalog_dir`` as one catalog (one provenance per file)."""
    b = CatalogBuilder()
    for provider, path in skypilot_files(catalog_dir):
        _load_into(b, provider, path)
    return b.build()


def load_skypilot_csv(path: str | Path, provider: str) -> Catalog:
    """One ``vms.csv`` of ``provider`` (``aws``, ``azure`` or ``gcp``) as a catalog."""
    b = CatalogBuilder()
    _load_into(b, provider, Path(path))
    return b.build()


@lru_cache(maxsize=1 << 17)
def _f(s: str) -> float | None:
    """A finite float, or ``None`` for empty/unparsable/NaN/inf (catalog cells repeat a lot: cached)."""
    if not s:
        return None
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


@lru_cache(maxsize=1 << 17)
def _price(s: str) -> float | None:
    v = _f(s)
    return v if v is not None and v > 0 else None


@lru_cache(maxsize=1 << 14)
def _azure_arm(name: str) -> bool:
    return _AZURE_ARM_RE.match(name) is not None


_FIELDS = ("InstanceType", "vCPUs", "MemoryGiB", "AcceleratorName", "AcceleratorCount", "GpuInfo", "Price",
           "SpotPrice", "Region", "AvailabilityZone", "Arch")


def _rows(path: Path) -> Iterator[tuple[str, ...]]:
    """Rows as tuples in ``_FIELDS`` order whatever the file's column order; a missing column reads ``""``."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header or "InstanceType" not in header or "Price" not in header:
                raise CatalogError(
                    f"{path}: not a SkyPilot v8 vms.csv (header {header!r}). To fix: the header must name "
                    "InstanceType, vCPUs, MemoryGiB, Price, SpotPrice and Region"
                )
            width = len(header)
            pick = operator.itemgetter(*(header.index(k) if k in header else width for k in _FIELDS))
            pad = [""]
            for rec in reader:
                if len(rec) != width:
                    # Unquoted "V1,V2" Generation values (see PROVENANCE.md): keep the leading columns.
                    rec = rec[:width] + [""] * (width - len(rec))
                rec += pad
                yield pick(rec)
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"cannot read {path}: {exc}") from exc


def _load_into(b: CatalogBuilder, provider: str, path: Path) -> None:
    source = f"skypilot-v8:{provider}"
    date = datetime.fromtimestamp(path.stat().st_mtime, UTC).date().isoformat()
    counts = _Counts()
    before = len(b)
    if provider == "gcp":
        _load_gcp(b, path, source, counts)
    else:
        _load_plain(b, provider, path, source, counts)
    b.provenance.append(
        Provenance(source=source, date=date, rows=counts.rows, offers=len(b) - before,
                   dropped=counts.dropped, duplicates=counts.duplicates, provider=provider)
    )


def _gpu_mem_gib(info: str) -> float:
    m = _GPU_MEM_RE.search(info) if info else None
    return int(m.group(1)) / 1024.0 if m else 0.0


def _load_plain(b: CatalogBuilder, provider: str, path: Path, source: str, counts: _Counts) -> None:
    out = _Cols()
    aws = provider == "aws"
    for name, vcpus_s, mem_s, acc, n_s, ginfo, price_s, spot_s, region, zone, arch in _rows(path):
        counts.rows += 1
        vcpus, mem = _f(vcpus_s), _f(mem_s)
        n_acc = _f(n_s) or 0.0
        if not name or vcpus is None or mem is None or not region or (acc and (n_acc != int(n_acc) or n_acc < 1)):
            counts.dropped += 1
            continue
        arm = arch in ("arm64", "aarch64") if aws else _azure_arm(name)
        gmem = _gpu_mem_gib(ginfo) if acc else 0.0
        if not out.add(_price(price_s), _price(spot_s), region, zone, name, vcpus, mem,
                       int(n_acc) if acc else 0, acc, gmem, arm):
            counts.dropped += 1
    b.extend(provider=provider, source=source, **out.cols)


@lru_cache(maxsize=4096)
def _gcp_fixed_gpu(name: str) -> tuple[str, int] | None:
    for rx, acc, _ in _GCP_FIXED:
        m = rx.match(name)
        if m:
            return acc, int(m.group(1))
    m = re.match(r"^g2-standard-(\d+)$", name)
    if m and int(m.group(1)) in _G2_L4:
        return "L4", _G2_L4[int(m.group(1))]
    return None


def _load_gcp(b: CatalogBuilder, path: Path, source: str, counts: _Counts) -> None:
    out = _Cols()
    hosts: list[tuple[str, ...]] = []
    # (region, zone, acc, count) -> (od, spot, gpu_mem_gib)
    gpus: dict[tuple[str, str, str, int], tuple[float | None, float | None, float]] = {}
    seen: set[tuple[str, str, str, str]] = set()
    for r in _rows(path):
        counts.rows += 1
        if r[0]:
            hosts.append(r)
            continue
        _, _, _, acc, n_s, ginfo, price_s, spot_s, region, zone, _ = r
        n = _f(n_s)
        raw_key = (region, zone, acc, n_s)
        if raw_key in seen:
            counts.duplicates += 1  # duplicate accelerator row: the first wins
            continue
        seen.add(raw_key)
        if not acc or n is None or n != int(n) or n < 1 or acc.startswith("tpu"):
            counts.dropped += 1
            continue
        gpus[(region, zone, acc, int(n))] = (_price(price_s), _price(spot_s), _gpu_mem_gib(ginfo))
    # N1 hosts per zone, for attachable GPUs.
    n1_by_zone: dict[tuple[str, str], list[tuple[str, float, float, float | None, float | None]]] = {}
    for name, vcpus_s, mem_s, acc_in_row, n_s, ginfo, price_s, spot_s, region, zone, _ in hosts:
        vcpus, mem = _f(vcpus_s), _f(mem_s)
        if vcpus is None or mem is None or not region:
            counts.dropped += 1
            continue
        od, spot = _price(price_s), _price(spot_s)
        arm = name.startswith(_GCP_ARM_PREFIX)
        fixed = _gcp_fixed_gpu(name)
        n_in_row = _f(n_s)
        if acc_in_row and n_in_row and n_in_row >= 1 and n_in_row == int(n_in_row):
            # A whole GPU VM (as Catalog.to_skypilot_csv writes them): the price already includes the GPUs.
            if not out.add(od, spot, region, zone, name, vcpus, mem, int(n_in_row), acc_in_row,
                           _gpu_mem_gib(ginfo), arm):
                counts.dropped += 1
            continue
        if fixed is not None:
            g = gpus.get((region, zone, fixed[0], fixed[1]))
            if g is None or not out.add(
                None if od is None or g[0] is None else od + g[0],
                None if spot is None or g[1] is None else spot + g[1],
                region, zone, name, vcpus, mem, fixed[1], fixed[0], g[2], arm,
            ):
                counts.dropped += 1
            continue
        if not out.add(od, spot, region, zone, name, vcpus, mem, 0, "", 0.0, arm):
            counts.dropped += 1
        if name.startswith("n1-"):
            n1_by_zone.setdefault((region, zone), []).append((name, vcpus, mem, od, spot))
    for (region, zone, acc, n), (g_od, g_spot, g_mem) in gpus.items():
        limits = _N1_LIMITS.get(acc, {}).get(n)
        if limits is None:
            continue
        for name, vcpus, mem, od, spot in n1_by_zone.get((region, zone), ()):
            if vcpus > limits[0] or mem > limits[1]:
                continue
            out.add(
                None if od is None or g_od is None else od + g_od,
                None if spot is None or g_spot is None else spot + g_spot,
                region, zone, f"{name}+{acc}:{n}", vcpus, mem, n, acc, g_mem, False,
            )
    b.extend(provider="gcp", source=source, **out.cols)
