"""The columnar price catalog: every offer of every provider in numpy arrays.

A :class:`Catalog` holds one row per offer (instance type x location x zone x capacity). Strings are stored
as small integer codes into tables (``type_names``, ``locations``, ``zones``, ``accelerators``...), so a query
over ~90k offers is a handful of vectorised comparisons (well under a millisecond).

Raw columns (all the same length, ``len(catalog)``), public and read-only by contract:

=================  ========  ====================================================================
``loc_code``       int32     index into ``locations`` (one :class:`Location` per provider:region)
``zone_code``      int32     index into ``zones`` (``zones[0] == ""`` means no zone)
``type_code``      int32     index into ``type_names``
``provider_code``  int8      index into ``providers``
``vcpus``          float32   vCPUs per instance
``memory_gib``     float32   memory per instance (GiB)
``gpus``           int16     whole accelerators per instance
``gpu_memory_gib`` float32   memory per accelerator (GiB, 0 when unknown)
``acc_code``       int16     index into ``accelerators`` (``accelerators[0] == ""`` means none)
``arch_code``      int8      index into ``ARCHS``
``cap_code``       int8      index into ``CAPACITIES``
``hourly_usd``     float64   USD per instance-hour
``outlier``        bool      price flagged by the outlier rule (see :func:`flag_outliers`)
``src_code``       int16     index into ``sources``
=================  ========  ====================================================================

Rows are sorted by ``hourly_usd`` ascending (stable), an invariant placement relies on.

Dedup key: ``(provider, region, zone, instance_type, capacity)``; the first row of a key wins, so
``a.merged_with(b)`` puts ``b`` first (``b`` wins where both price the same offer).

Outlier rule (a data error, not a price level): take the on-demand prices of one (provider, instance type) over
all of that provider's rows, sorted. A price is an outlier when it lies below a *gap*: some price at or above it
is less than half (``OUTLIER_FRACTION``) of the next dearer price, and that price is also below half the
median. So a price shared by several regions, or a run of prices each within 2x of the next, is a real price
level and never flagged; equal prices always get the same verdict, and every row cheaper than a flagged row of
the type is flagged too. The spot offers of a flagged (location, zone, type) are flagged with it.
:meth:`Catalog.outlier_reason` says why a row is flagged. Outliers stay in the catalog but
:meth:`Catalog.query` and placement skip them unless ``include_outliers``; an :class:`Offer` read from the
catalog carries its flag, so ``check_offer`` judges it as placement does.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from broker.errors import CatalogError
from broker.model import Arch, Capacity, InstanceType, Location, Offer, Provenance, SiteKind

__all__ = ["Catalog", "CatalogBuilder", "CAPACITIES", "ARCHS", "flag_outliers", "OUTLIER_FRACTION"]

CAPACITIES: tuple[Capacity, ...] = (Capacity.ON_DEMAND, Capacity.SPOT, Capacity.RESERVED, Capacity.OWNED)
ARCHS: tuple[str, ...] = (Arch.AMD64.value, Arch.ARM64.value)
OUTLIER_FRACTION = 0.5
_CAP_INDEX = {c.value: i for i, c in enumerate(CAPACITIES)}
_FORMAT = 1  # bump when the npz layout changes

IntArray = npt.NDArray[np.int64]

_COLUMNS: dict[str, Any] = {
    "loc_code": np.int32,
    "zone_code": np.int32,
    "type_code": np.int32,
    "provider_code": np.int8,
    "vcpus": np.float32,
    "memory_gib": np.float32,
    "gpus": np.int16,
    "gpu_memory_gib": np.float32,
    "acc_code": np.int16,
    "arch_code": np.int8,
    "cap_code": np.int8,
    "hourly_usd": np.float64,
    "outlier": np.bool_,
    "src_code": np.int16,
}


class _Codes:
    """An append-only string -> code table."""

    __slots__ = ("index", "values")

    def __init__(self, first: Sequence[str] = ()) -> None:
        self.values: list[str] = []
        self.index: dict[str, int] = {}
        for v in first:
            self.code(v)

    def code(self, value: str) -> int:
        c = self.index.get(value)
        if c is None:
            c = self.index[value] = len(self.values)
            self.values.append(value)
        return c

    def codes(self, values: Sequence[str]) -> list[int]:
        for v in dict.fromkeys(values):  # first-appearance order keeps codes (and versions) deterministic
            if v not in self.index:
                self.code(v)
        index = self.index
        return [index[v] for v in values]


@dataclass
class CatalogBuilder:
    """Accumulates offers row by row (fast path for loaders), then :meth:`build` makes a :class:`Catalog`.

    ``add`` takes plain values so that loaders never build an :class:`Offer` per row. Rows with the same
    dedup key as an earlier row are dropped at :meth:`build` and counted as duplicates of their provider.
    """

    provenance: list[Provenance] = field(default_factory=list)
    _locs: _Codes = field(default_factory=_Codes)
    _loc_objs: list[Location] = field(default_factory=list)
    _zones: _Codes = field(default_factory=lambda: _Codes([""]))
    _types: _Codes = field(default_factory=_Codes)
    _providers: _Codes = field(default_factory=_Codes)
    _accs: _Codes = field(default_factory=lambda: _Codes([""]))
    _srcs: _Codes = field(default_factory=_Codes)
    _cols: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in _COLUMNS})

    def location_code(self, provider: str, region: str, site: SiteKind = SiteKind.CLOUD,
                      continent: str | None = None) -> int:
        key = f"{provider}:{region}"
        code = self._locs.index.get(key)
        if code is None:
            if continent is None:
                from pricing.geo import continent_of

                continent = continent_of(provider, region)
            code = self._locs.code(key)
            self._loc_objs.append(Location(provider, region, None, site, continent))
            self._providers.code(provider)
        return code

    def add(
        self,
        *,
        provider: str,
        region: str,
        instance_type: str,
        vcpus: float,
        memory_gib: float,
        hourly_usd: float,
        capacity: str = "on-demand",
        zone: str | None = None,
        gpus: int = 0,
        accelerator: str | None = None,
        gpu_memory_gib: float = 0.0,
        arch: str = "amd64",
        source: str = "",
        site: SiteKind = SiteKind.CLOUD,
        continent: str | None = None,
        outlier: bool = False,
    ) -> None:
        """Append one offer. ``capacity`` is a :class:`Capacity` value; ``arch`` ``amd64`` or ``arm64``."""
        c = self._cols
        c["loc_code"].append(self.location_code(provider, region, site, continent))
        c["zone_code"].append(self._zones.code(zone or ""))
        c["type_code"].append(self._types.code(instance_type))
        c["provider_code"].append(self._providers.code(provider))
        c["vcpus"].append(vcpus)
        c["memory_gib"].append(memory_gib)
        c["gpus"].append(gpus)
        c["gpu_memory_gib"].append(gpu_memory_gib)
        c["acc_code"].append(self._accs.code(accelerator or ""))
        c["arch_code"].append(1 if arch == "arm64" else 0)
        c["cap_code"].append(_CAP_INDEX[str(capacity)])
        c["hourly_usd"].append(hourly_usd)
        c["outlier"].append(outlier)  # an explicit flag (Offer.outlier) is kept; the rule adds its own
        c["src_code"].append(self._srcs.code(source))

    def extend(
        self,
        *,
        provider: str,
        source: str,
        regions: Sequence[str],
        zones: Sequence[str],
        names: Sequence[str],
        vcpus: Sequence[float],
        memory_gib: Sequence[float],
        gpus: Sequence[int],
        accelerators: Sequence[str],
        gpu_memory_gib: Sequence[float],
        arm: Sequence[bool],
        spot: Sequence[bool],
        hourly_usd: Sequence[float],
    ) -> None:
        """Append many cloud offers of one provider and source at once (the loaders' fast path). All
        sequences have the same length; ``zones``/``accelerators`` use ``""`` for none."""
        n = len(hourly_usd)
        c = self._cols
        loc_of: dict[str, int] = {}
        for r in dict.fromkeys(regions):
            loc_of[r] = self.location_code(provider, r)
        c["loc_code"].extend([loc_of[r] for r in regions])
        c["zone_code"].extend(self._zones.codes(zones))
        c["type_code"].extend(self._types.codes(names))
        c["provider_code"].extend([self._providers.code(provider)] * n)
        c["vcpus"].extend(vcpus)
        c["memory_gib"].extend(memory_gib)
        c["gpus"].extend(gpus)
        c["gpu_memory_gib"].extend(gpu_memory_gib)
        c["acc_code"].extend(self._accs.codes(accelerators))
        c["arch_code"].extend([1 if a else 0 for a in arm])
        c["cap_code"].extend([1 if sp else 0 for sp in spot])
        c["hourly_usd"].extend(hourly_usd)
        c["outlier"].extend([False] * n)
        c["src_code"].extend([self._srcs.code(source)] * n)

    def __len__(self) -> int:
        return len(self._cols["hourly_usd"])

    def build(self) -> Catalog:
        """The catalog of every row added, deduplicated, outliers flagged, provenance counts updated."""
        arrays = {k: np.asarray(v, dtype=_COLUMNS[k]) for k, v in self._cols.items()}
        cat = Catalog(
            arrays,
            locations=list(self._loc_objs),
            zones=list(self._zones.values),
            type_names=list(self._types.values),
            providers=list(self._providers.values),
            accelerators=list(self._accs.values),
            sources=list(self._srcs.values),
            provenance=tuple(self.provenance),
        )
        return cat._dedup(count=True)._with_outliers(keep_given=True)


class Catalog:
    """Every offer, columnar. Build with :class:`CatalogBuilder`, :meth:`from_offers` or
    :func:`pricing.load_catalog`; never mutated after construction (methods return new catalogs)."""

    def __init__(
        self,
        columns: dict[str, np.ndarray],
        *,
        locations: list[Location],
        zones: list[str],
        type_names: list[str],
        providers: list[str],
        accelerators: list[str],
        sources: list[str],
        provenance: tuple[Provenance, ...],
    ) -> None:
        n = len(columns["hourly_usd"])
        for k, dt in _COLUMNS.items():
            col = np.asarray(columns[k], dtype=dt)
            if len(col) != n:
                raise CatalogError(f"catalog column {k} has {len(col)} rows, expected {n}")
            col.setflags(write=False)
            setattr(self, k, col)
        self.locations: list[Location] = locations
        self.zones: list[str] = zones
        self.type_names: list[str] = type_names
        self.providers: list[str] = providers
        self.accelerators: list[str] = accelerators
        self.sources: list[str] = sources
        self.provenance: tuple[Provenance, ...] = provenance
        self._version: str | None = None
        self._shards: tuple[Catalog, Catalog] | None = None
        self._derived: dict[str, Any] = {}
        self._loc_masks: dict[tuple[tuple[str, ...], tuple[str, ...]], np.ndarray] = {}
        self._acc_upper = {a.upper(): i for i, a in enumerate(accelerators) if a}
        self._loc_index = {loc.key: i for i, loc in enumerate(locations)}

    # Declared for type checkers; set in __init__ from _COLUMNS.
    loc_code: npt.NDArray[np.int32]
    zone_code: npt.NDArray[np.int32]
    type_code: npt.NDArray[np.int32]
    provider_code: npt.NDArray[np.int8]
    vcpus: npt.NDArray[np.float32]
    memory_gib: npt.NDArray[np.float32]
    gpus: npt.NDArray[np.int16]
    gpu_memory_gib: npt.NDArray[np.float32]
    acc_code: npt.NDArray[np.int16]
    arch_code: npt.NDArray[np.int8]
    cap_code: npt.NDArray[np.int8]
    hourly_usd: npt.NDArray[np.float64]
    outlier: npt.NDArray[np.bool_]
    src_code: npt.NDArray[np.int16]

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return len(self.hourly_usd)

    def __repr__(self) -> str:
        return f"Catalog({len(self)} offers, {len(self.locations)} locations, version={self.version})"

    @property
    def version(self) -> str:
        """``<date>-<12 hex>``: the newest provenance date and a hash of the content. Identical inputs give
        identical versions; any change of any price, spec or table gives a different one."""
        if self._version is None:
            h = hashlib.sha256()
            for k in _COLUMNS:
                h.update(k.encode())
                h.update(np.ascontiguousarray(getattr(self, k)).tobytes())
            h.update(json.dumps(self._tables(), sort_keys=True).encode())
            dates = [p.date for p in self.provenance if p.date]
            date = max(dates)[:10] if dates else "undated"
            self._version = f"{date}-{h.hexdigest()[:12]}"
        return self._version

    def location_index(self, key: str) -> int | None:
        """The code of location ``provider:region`` or ``None`` when the catalog has no offer there."""
        return self._loc_index.get(key)

    def has_location(self, key: str) -> bool:
        return key in self._loc_index

    def accelerator_code(self, name: str) -> int | None:
        """The code of an accelerator model (case-insensitive), ``None`` when no offer carries it."""
        return self._acc_upper.get(name.upper())

    def offer(self, i: int) -> Offer:
        """Offer ``i`` as a model object (slow path: for display and for the chosen few)."""
        i = int(i)
        loc = self.locations[int(self.loc_code[i])]
        zone = self.zones[int(self.zone_code[i])] or None
        if zone is not None:
            loc = replace(loc, zone=zone)
        acc = self.accelerators[int(self.acc_code[i])] or None
        it = InstanceType(
            name=self.type_names[int(self.type_code[i])],
            vcpus=float(self.vcpus[i]),
            memory_gib=float(self.memory_gib[i]),
            gpus=int(self.gpus[i]),
            accelerator=acc,
            gpu_memory_gib=float(self.gpu_memory_gib[i]),
            arch=ARCHS[int(self.arch_code[i])],
        )
        return Offer(
            instance_type=it,
            location=loc,
            capacity=CAPACITIES[int(self.cap_code[i])],
            hourly_usd=float(self.hourly_usd[i]),
            source=self.sources[int(self.src_code[i])],
            outlier=bool(self.outlier[i]),
        )

    def offers(self, indices: Iterable[int] | np.ndarray) -> list[Offer]:
        return [self.offer(int(i)) for i in indices]

    # ------------------------------------------------------------------ queries
    def location_mask(self, providers: Sequence[str] = (), regions: Sequence[str] = ()) -> np.ndarray:
        """Boolean per location code: allowed by the provider and region allow-lists (empty = any).
        A region entry matches a region name (``eu-west-1``) or a location key (``aws:eu-west-1``)."""
        key = (tuple(providers), tuple(regions))
        hit = self._loc_masks.get(key)
        if hit is None:
            if len(self._loc_masks) >= 1024:
                self._loc_masks.clear()
            hit = self._loc_masks[key] = self._location_mask(providers, regions)
        return hit.copy()

    def _location_mask(self, providers: Sequence[str], regions: Sequence[str]) -> np.ndarray:
        ok = np.ones(len(self.locations), dtype=bool)
        if providers:
            pset = set(providers)
            ok &= np.fromiter((loc.provider in pset for loc in self.locations), bool, len(self.locations))
        if regions:
            rset = set(regions)
            ok &= np.fromiter(
                (loc.region in rset or loc.key in rset for loc in self.locations), bool, len(self.locations)
            )
        return ok

    def query(
        self,
        *,
        min_vcpus: float = 0,
        min_memory_gib: float = 0,
        gpus: int = 0,
        accelerator: str | None = None,
        arch: str | None = None,
        providers: Sequence[str] = (),
        regions: Sequence[str] = (),
        capacities: Sequence[str] = (),
        max_hourly_usd: float | None = None,
        include_outliers: bool = False,
    ) -> IntArray:
        """Indices (ascending) of offers with at least these resources, allowed by the allow-lists.

        ``gpus`` is a minimum; ``accelerator`` matches the model exactly (case-insensitive; unknown -> no
        rows); ``arch`` ``None``/``any`` matches all; ``capacities`` are :class:`Capacity` values (empty = any).
        """
        m = np.ones(len(self), dtype=bool)
        if min_vcpus:
            m &= self.vcpus >= np.float32(min_vcpus) - np.float32(1e-6)
        if min_memory_gib:
            m &= self.memory_gib >= np.float32(min_memory_gib) - np.float32(1e-3)
        if gpus:
            m &= self.gpus >= gpus
        if accelerator:
            code = self.accelerator_code(accelerator)
            if code is None:
                return np.zeros(0, dtype=np.int64)
            m &= self.acc_code == code
        if arch and arch != Arch.ANY.value:
            m &= self.arch_code == (1 if arch == "arm64" else 0)
        if providers or regions:
            m &= self.location_mask(providers, regions)[self.loc_code]
        if capacities:
            codes = [_CAP_INDEX[str(c)] for c in capacities]
            m &= np.isin(self.cap_code, codes)
        if max_hourly_usd is not None:
            m &= self.hourly_usd <= max_hourly_usd
        if not include_outliers:
            m &= ~self.outlier
        return np.flatnonzero(m)

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_offers(cls, offers: Iterable[Offer], provenance: Provenance) -> Catalog:
        """A catalog of these offers (deduplicated; outliers flagged) with one provenance record; every row's
        source is ``provenance.source`` (the offer's own ``source`` when that is empty)."""
        b = CatalogBuilder(provenance=[provenance])
        for o in offers:
            it, loc = o.instance_type, o.location
            b.add(
                provider=loc.provider,
                region=loc.region,
                zone=loc.zone,
                instance_type=it.name,
                vcpus=it.vcpus,
                memory_gib=it.memory_gib,
                gpus=it.gpus,
                accelerator=it.accelerator,
                gpu_memory_gib=it.gpu_memory_gib,
                arch=it.arch,
                capacity=str(o.capacity),
                hourly_usd=o.hourly_usd,
                source=provenance.source or o.source,
                site=loc.site,
                continent=loc.continent or None,
                outlier=o.outlier,
            )
        return b.build()

    def merged_with(self, other: Catalog) -> Catalog:
        """``self`` and ``other`` in one catalog; where both price the same offer, ``other`` wins."""
        both = _concat([other, self])
        n_other = len(other)
        # A region-level row of self (no zone) is superseded by any zone-level row of other for the same
        # (location, type, capacity): the loaded catalog prices that offer.
        wide = (both.loc_code.astype(np.int64) * (len(both.type_names) + 1) + both.type_code) * 8 + both.cap_code
        keep = np.ones(len(both), dtype=bool)
        if n_other and len(both) > n_other:
            mine = np.arange(len(both)) >= n_other
            keep &= ~(mine & (both.zone_code == 0) & np.isin(wide, wide[:n_other]))
        return both.subset(np.flatnonzero(keep))._dedup(count=False)._with_outliers()

    def subset(self, indices: np.ndarray) -> Catalog:
        """The catalog of only these rows (tables and provenance kept: codes stay comparable)."""
        cols = {k: getattr(self, k)[indices] for k in _COLUMNS}
        return Catalog(cols, **self._table_kwargs())

    def with_provenance(self, provenance: Sequence[Provenance]) -> Catalog:
        """The same rows with other provenance records (e.g. counts updated by a loader)."""
        kw = self._table_kwargs()
        kw["provenance"] = tuple(provenance)
        return Catalog({k: getattr(self, k) for k in _COLUMNS}, **kw)

    def derived(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()``, computed once per catalog object and kept under ``key`` (for indexes that users of
        the catalog derive from its immutable columns, e.g. placement's offer groups)."""
        hit = self._derived.get(key)
        if hit is None:
            hit = self._derived[key] = build()
        return hit

    def capacity_shards(self) -> tuple[Catalog, Catalog]:
        """``(everything but spot, spot)``: two price-sorted subsets sharing this catalog's tables, built once.
        Placement scans only the shards a request's spot policy can use."""
        if self._shards is None:
            spot = self.cap_code == CAPACITIES.index(Capacity.SPOT)
            self._shards = (self.subset(np.flatnonzero(~spot)), self.subset(np.flatnonzero(spot)))
        return self._shards

    # ------------------------------------------------------------------ persistence
    def _tables(self) -> dict[str, Any]:
        return {
            "locations": [[lo.provider, lo.region, lo.site.value, lo.continent] for lo in self.locations],
            "zones": self.zones,
            "type_names": self.type_names,
            "providers": self.providers,
            "accelerators": self.accelerators,
            "sources": self.sources,
        }

    def _table_kwargs(self) -> dict[str, Any]:
        return {
            "locations": self.locations,
            "zones": self.zones,
            "type_names": self.type_names,
            "providers": self.providers,
            "accelerators": self.accelerators,
            "sources": self.sources,
            "provenance": self.provenance,
        }

    def save_npz(self, path: str | Path) -> None:
        """Write the catalog (columns, tables, provenance) to one ``.npz`` file."""
        meta = {
            "format": _FORMAT,
            "tables": self._tables(),
            "provenance": [_prov_dict(p) for p in self.provenance],
        }
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, meta=np.array(json.dumps(meta)), **{k: getattr(self, k) for k in _COLUMNS})
        tmp.replace(path)

    @classmethod
    def load_npz(cls, path: str | Path) -> Catalog:
        """Read a file written by :meth:`save_npz`. Raises :class:`CatalogError` when unreadable."""
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                if meta.get("format") != _FORMAT:
                    raise CatalogError(f"{path}: catalog format {meta.get('format')} is not {_FORMAT}")
                cols = {k: z[k] for k in _COLUMNS}
        except (OSError, KeyError, ValueError) as exc:
            raise CatalogError(f"cannot read catalog file {path}: {exc}. To fix: delete it and reload") from exc
        t = meta["tables"]
        return cls(
            cols,
            locations=[Location(p, r, None, SiteKind(s), c) for p, r, s, c in t["locations"]],
            zones=t["zones"],
            type_names=t["type_names"],
            providers=t["providers"],
            accelerators=t["accelerators"],
            sources=t["sources"],
            provenance=tuple(Provenance(**p) for p in meta["provenance"]),
        )

    def to_skypilot_csv(self, directory: str | Path) -> list[Path]:
        """Write cloud offers as SkyPilot v8 ``<dir>/<provider>/vms.csv`` (one row per instance type x
        region x zone, on-demand ``Price`` and ``SpotPrice`` side by side; missing side written empty).
        GCP offers are written as whole VMs (GPU included in the price). Returns the files written."""
        out: list[Path] = []
        directory = Path(directory)
        for pcode, provider in enumerate(self.providers):
            if provider not in ("aws", "azure", "gcp"):
                continue
            idx = np.flatnonzero((self.provider_code == pcode) & (self.cap_code <= 1))
            rows: dict[tuple[int, int, int], dict[str, Any]] = {}
            for i in idx:
                key = (int(self.type_code[i]), int(self.loc_code[i]), int(self.zone_code[i]))
                r = rows.setdefault(key, {"i": int(i)})
                r["Price" if self.cap_code[i] == 0 else "SpotPrice"] = float(self.hourly_usd[i])
            pdir = directory / provider
            pdir.mkdir(parents=True, exist_ok=True)
            path = pdir / "vms.csv"
            header = _SKY_HEADERS[provider]
            with path.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=header)
                w.writeheader()
                for (tcode, lcode, zcode), r in sorted(rows.items()):
                    i = r["i"]
                    acc = self.accelerators[int(self.acc_code[i])]
                    arch = ARCHS[int(self.arch_code[i])]
                    row = {
                        "InstanceType": self.type_names[tcode],
                        "AcceleratorName": acc,
                        "AcceleratorCount": f"{int(self.gpus[i])}.0" if acc else "",
                        "vCPUs": float(self.vcpus[i]),
                        "MemoryGiB": float(self.memory_gib[i]),
                        "GpuInfo": "",
                        "Price": r.get("Price", ""),
                        "SpotPrice": r.get("SpotPrice", ""),
                        "Region": self.locations[lcode].region,
                        "AvailabilityZone": self.zones[zcode],
                        "Arch": "arm64" if arch == "arm64" else "x86_64",
                        "Generation": "V1,V2",
                    }
                    w.writerow({k: row[k] for k in header})
            out.append(path)
        return out

    # ------------------------------------------------------------------ internals
    def _dedup(self, *, count: bool) -> Catalog:
        n = len(self)
        if n == 0:
            return self
        key = (
            (self.loc_code.astype(np.int64) * (len(self.zones) + 1) + self.zone_code) * (len(self.type_names) + 1)
            + self.type_code
        ) * 8 + self.cap_code
        _, first = np.unique(key, return_index=True)
        if len(first) == n:
            return self
        first.sort()
        prov = self.provenance
        if count:
            dup = np.ones(n, dtype=bool)
            dup[first] = False
            # A duplicate counts against the provenance record of its own (provider, source) when there is
            # one (a provider may have one record per source, e.g. on-demand and spot), else its provider's.
            per_provider = np.bincount(self.provider_code[dup], minlength=len(self.providers))
            keyed = {(p.provider, p.source) for p in prov}
            per_pair: dict[tuple[str, str], int] = {}
            for pc, sc in zip(self.provider_code[dup].tolist(), self.src_code[dup].tolist(), strict=True):
                pair = (self.providers[pc], self.sources[sc])
                if pair in keyed:
                    per_pair[pair] = per_pair.get(pair, 0) + 1
                    per_provider[pc] -= 1
            prov = tuple(
                replace(p, duplicates=p.duplicates + per_pair.get((p.provider, p.source), 0)
                        + (int(per_provider[self.providers.index(p.provider)])
                           if (p.provider, p.source) == _first_of(prov, p.provider) else 0))
                if p.provider in self.providers
                else p
                for p in prov
            )
        cols = {k: getattr(self, k)[first] for k in _COLUMNS}
        kw = self._table_kwargs()
        kw["provenance"] = prov
        return Catalog(cols, **kw)

    def outlier_reason(self, i: int) -> str:
        """Why row ``i`` is flagged as an outlier (``""`` when it is not), with the figures of the rule."""
        i = int(i)
        if not self.outlier[i]:
            return ""
        name = self.type_names[int(self.type_code[i])]
        same = (self.provider_code == self.provider_code[i]) & (self.type_code == self.type_code[i])
        od = np.sort(self.hourly_usd[same & (self.cap_code == 0)])
        if len(od) == 0:
            return "flagged by its source (no on-demand price of this type to compare with)"
        base = ((self.loc_code == self.loc_code[i]) & (self.zone_code == self.zone_code[i]) & same
                & (self.cap_code == 0))
        own = float(self.hourly_usd[base][0]) if base.any() else float(self.hourly_usd[i])
        flagged = od[np.isin(od, self.hourly_usd[same & (self.cap_code == 0) & self.outlier])]
        if len(flagged) == 0:
            return "flagged by its source (the rule does not flag this type's on-demand prices)"
        cut = float(flagged.max())
        nxt = float(od[od > cut].min()) if (od > cut).any() else cut
        med = float(np.median(od))
        head = f"{name} on-demand ${own:.4f}/h" + ("" if self.cap_code[i] == 0 else " (this spot offer's twin)")
        return (f"{head} lies below a price gap: its type's next dearer price level is ${nxt:.4f}/h (> 2 x "
                f"${cut:.4f}) and the median of its {len(od)} on-demand rows is ${med:.4f}/h; a price under half "
                "of both is taken for a data error")

    def _with_outliers(self, *, keep_given: bool = False) -> Catalog:
        """Outliers flagged, provenance counted, rows ordered by ``hourly_usd`` (stable): placement relies on
        the price order to rank compute-only requests without sorting. ``keep_given`` keeps the flags the
        rows already carry (offers built from flagged :class:`Offer` objects) besides the rule's."""
        flags = flag_outliers(self)
        if keep_given:
            flags |= self.outlier
        order = np.argsort(self.hourly_usd, kind="stable")
        cols = {k: getattr(self, k)[order] for k in _COLUMNS}
        cols["outlier"] = flags[order]
        kw = self._table_kwargs()
        prov = []
        for p in self.provenance:
            sel = np.ones(len(self), dtype=bool)
            if p.provider and p.provider in self.providers:
                sel &= self.provider_code == self.providers.index(p.provider)
            if p.source in self.sources:
                sel &= self.src_code == self.sources.index(p.source)
            else:
                sel &= False
            prov.append(replace(p, outliers=int(np.count_nonzero(flags & sel)),
                                offers=int(np.count_nonzero(sel))))
        kw["provenance"] = tuple(prov)
        return Catalog(cols, **kw)


def flag_outliers(cat: Catalog, fraction: float = OUTLIER_FRACTION) -> npt.NDArray[np.bool_]:
    """Outlier flags per row (the gap rule of the module docstring): per (provider, instance type), the
    on-demand prices sorted; the cut is the dearest price ``p`` with ``p < fraction x next dearer price`` and
    ``p < fraction x median``; every on-demand price ``<= cut`` is flagged, and so are the spot rows of a
    flagged (location, zone, type). Owned/reserved capacity is never flagged."""
    n = len(cat)
    flags = np.zeros(n, dtype=bool)
    od = np.flatnonzero(cat.cap_code == 0)
    if len(od) == 0:
        return flags
    group = cat.provider_code[od].astype(np.int64) * (len(cat.type_names) + 1) + cat.type_code[od]
    price = cat.hourly_usd[od]
    order = np.lexsort((price, group))
    g_sorted = group[order]
    p_sorted = price[order]
    starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
    counts = np.diff(np.r_[starts, len(g_sorted)])
    lo = starts + (counts - 1) // 2
    hi = starts + counts // 2
    med = (p_sorted[lo] + p_sorted[hi]) / 2.0
    med_per_row = np.repeat(med, counts)
    same_group_next = np.r_[g_sorted[1:] == g_sorted[:-1], False]
    nxt = np.r_[p_sorted[1:], np.inf]
    gap = same_group_next & (p_sorted < fraction * nxt) & (p_sorted < fraction * med_per_row)
    # Flag every row of a group up to its last gap: a running "a gap lies at or after me" per group,
    # computed as a reversed cumulative max of the gap positions within the group.
    gid = np.repeat(np.arange(len(starts)), counts)
    pos = np.arange(len(p_sorted))
    last_gap = np.full(len(starts), -1, dtype=np.int64)
    gp = pos[gap]
    np.maximum.at(last_gap, gid[gap], gp)
    out_sorted = pos <= last_gap[gid]
    od_flags = np.zeros(len(od), dtype=bool)
    od_flags[order] = out_sorted
    flags[od] = od_flags
    if od_flags.any():
        base = (cat.loc_code.astype(np.int64) * (len(cat.zones) + 1) + cat.zone_code) * (
            len(cat.type_names) + 1
        ) + cat.type_code
        bad = np.unique(base[flags])
        spot = cat.cap_code == 1
        flags |= spot & np.isin(base, bad)
    return flags


def _first_of(prov: Sequence[Provenance], provider: str) -> tuple[str, str] | None:
    """``(provider, source)`` of the first provenance record of ``provider``, ``None`` when it has none."""
    return next(((p.provider, p.source) for p in prov if p.provider == provider), None)


def _prov_dict(p: Provenance) -> dict[str, Any]:
    return {k: getattr(p, k) for k in Provenance.__dataclass_fields__}


def _concat(cats: Sequence[Catalog]) -> Catalog:
    """One catalog of all rows of ``cats`` in order, tables re-coded (no dedup)."""
    b = CatalogBuilder()
    cols: dict[str, list[np.ndarray]] = {k: [] for k in _COLUMNS}
    for cat in cats:
        maps: dict[str, np.ndarray] = {
            "loc_code": np.array(
                [b.location_code(lo.provider, lo.region, lo.site, lo.continent) for lo in cat.locations],
                dtype=np.int32,
            ),
            "zone_code": np.array([b._zones.code(z) for z in cat.zones], dtype=np.int32),
            "type_code": np.array([b._types.code(t) for t in cat.type_names], dtype=np.int32),
            "provider_code": np.array([b._providers.code(p) for p in cat.providers], dtype=np.int8),
            "acc_code": np.array([b._accs.code(a) for a in cat.accelerators], dtype=np.int16),
            "src_code": np.array([b._srcs.code(s) for s in cat.sources], dtype=np.int16),
        }
        maps_ = maps
        for k in _COLUMNS:
            col = getattr(cat, k)
            cols[k].append(maps_[k][col] if k in maps_ and len(col) else col)
    prov: list[Provenance] = []
    for cat in reversed(cats):  # keep the original order of provenance: base first
        prov.extend(cat.provenance)
    return Catalog(
        {k: np.concatenate(v) if v else np.zeros(0, _COLUMNS[k]) for k, v in cols.items()},
        locations=list(b._loc_objs),
        zones=list(b._zones.values),
        type_names=list(b._types.values),
        providers=list(b._providers.values),
        accelerators=list(b._accs.values),
        sources=list(b._srcs.values),
        provenance=tuple(prov),
    )


_SKY_HEADERS = {
    "aws": ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "GpuInfo", "Price",
            "SpotPrice", "Region", "AvailabilityZone", "Arch"],
    "gcp": ["InstanceType", "vCPUs", "MemoryGiB", "AcceleratorName", "AcceleratorCount", "GpuInfo", "Region",
            "AvailabilityZone", "Price", "SpotPrice"],
    "azure": ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "GpuInfo", "Price",
              "SpotPrice", "Region", "Generation"],
}
