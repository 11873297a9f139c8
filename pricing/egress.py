"""Egress prices and bandwidth between any two locations.

Rules (data in ``pricing/data/egress-v1.yaml``, with its sources):

* same location (``provider:region``; zones equal or unknown): **0 $/GiB**, ``same_region`` Gbit/s;
  same region, different known zones: the provider's cross-zone rate;
* same provider, different region: inter-region rate by the source region's continent (its own table:
  within the continent, to a named continent, to any other), else the provider's same/cross default;
* different providers (or a cloud and the internet): the source cloud's internet egress tiers;
* on-prem / edge sites (from the inventory, :meth:`EgressModel.with_sites`): leaving a site costs its
  ``egress_usd_per_gib``, entering it its ``ingress_usd_per_gib`` (plus the cloud's internet egress when the
  other end is a cloud); bandwidth is capped by the site's uplink; a site ``link`` to a location overrides
  price and bandwidth of that pair, both directions.

``usd_per_gib`` is the marginal (first-tier) rate; :meth:`EgressModel.egress_usd` applies the tiers to one
transfer. All functions are pure; vectors over many destinations are cached per source.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from broker.errors import SpecError
from broker.model import Location, SiteKind, split_location_key
from pricing.geo import continent_of
from pricing.inventory import Site

__all__ = ["EgressModel", "load_egress", "DEFAULT_EGRESS_PATH", "GBIT_PER_GIB"]

DEFAULT_EGRESS_PATH = Path(__file__).parent / "data" / "egress-v1.yaml"
GBIT_PER_GIB = 8 * 2**30 / 1e9  # 8.589934592

Tiers = tuple[tuple[float, float], ...]  # ((up_to_gib or inf, usd_per_gib), ...)
_FREE: Tiers = ((float("inf"), 0.0),)


def _tiered(tiers: Tiers, size_gib: float) -> float:
    cost, prev = 0.0, 0.0
    for up_to, rate in tiers:
        if size_gib <= prev:
            break
        cost += (min(size_gib, up_to) - prev) * rate
        prev = up_to
    return cost


def _shift(tiers: Tiers, add: float) -> Tiers:
    return tuple((u, r + add) for u, r in tiers) if add else tiers


@dataclass(frozen=True)
class EgressModel:
    """Prices and bandwidths from an egress data document (see module docstring). Build with
    :func:`load_egress`; add own sites with :meth:`with_sites`."""

    config: Mapping[str, Any]
    sites: Mapping[str, Site] = field(default_factory=dict)
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False, hash=False)

    # ------------------------------------------------------------------ public
    def with_sites(self, sites: Iterable[Site]) -> EgressModel:
        """A model that also knows these on-prem/edge sites (by ``provider:name`` key)."""
        merged = dict(self.sites)
        merged.update({s.key: s for s in sites})
        return EgressModel(self.config, merged)

    def location(self, loc: Location | str) -> Location:
        """``loc`` as a :class:`Location` (a key string is resolved through the known sites and region
        tables). Raises :class:`SpecError` when ``loc`` is not ``provider:region``."""
        if isinstance(loc, Location):
            return loc
        try:
            provider, region = split_location_key(loc)
        except ValueError as exc:
            raise SpecError("location", str(exc)) from None
        site = self.sites.get(loc)
        if site is not None:
            return site.location
        if provider in ("onprem", "edge"):
            return Location(provider, region, None, SiteKind(provider), "")
        return Location(provider, region, None, SiteKind.CLOUD, continent_of(provider, region))

    def usd_per_gib(self, src: Location | str, dst: Location | str) -> float:
        """Marginal USD per GiB moved from ``src`` to ``dst`` (first tier); 0 within one location."""
        return self._route(self.location(src), self.location(dst))[0][0][1]

    def egress_usd(self, src: Location | str, dst: Location | str, size_gib: float) -> float:
        """USD to move ``size_gib`` GiB from ``src`` to ``dst`` in one transfer, tiers applied."""
        return _tiered(self._route(self.location(src), self.location(dst))[0], size_gib)

    def gbps(self, src: Location | str, dst: Location | str) -> float:
        """Sustained Gbit/s of a bulk transfer from ``src`` to ``dst``."""
        return self._route(self.location(src), self.location(dst))[1]

    def transfer_hours(self, src: Location | str, dst: Location | str, size_gib: float) -> float:
        """Hours to move ``size_gib`` GiB; 0 when ``src`` and ``dst`` are the same location."""
        s, d = self.location(src), self.location(dst)
        if _same_place(s, d) or size_gib <= 0:
            return 0.0
        return size_gib * GBIT_PER_GIB / self._route(s, d)[1] / 3600.0

    def to_locations(
        self, src: Location | str, size_gib: float, locations: Sequence[Location]
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(usd, hours)`` float64 arrays, one entry per destination in ``locations``: the cost and time of
        moving ``size_gib`` from ``src`` there. Route classes are cached per (src, locations) so that a
        call costs a few numpy operations (placement calls this once per data input)."""
        s = self.location(src)
        key = (s, id(locations), len(locations))
        hit = self._cache.get(key)
        if hit is None or hit[0] is not locations:
            classes: dict[tuple[Tiers, float, bool], int] = {}
            codes = np.empty(len(locations), dtype=np.int32)
            for i, d in enumerate(locations):
                tiers, gbps = self._route(s, d)
                codes[i] = classes.setdefault((tiers, gbps, _same_place(s, d)), len(classes))
            hit = (locations, codes, list(classes))
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[key] = hit
        _, codes, cls = hit
        usd = np.array([_tiered(t, size_gib) for t, _, _ in cls])
        hours = np.array([0.0 if same else size_gib * GBIT_PER_GIB / g / 3600.0 for _, g, same in cls])
        return usd[codes], hours[codes]

    # ------------------------------------------------------------------ internals
    def _site(self, loc: Location) -> Site | None:
        if loc.site == SiteKind.CLOUD:
            return None
        s = self.sites.get(loc.key)
        if s is not None:
            return s
        d = self.config.get("default_site", {})
        return Site(loc.region, loc.provider, loc.continent, float(d.get("uplink_gbps", 1.0)),
                    float(d.get("egress_usd_per_gib", 0.0)), float(d.get("ingress_usd_per_gib", 0.0)))

    def _internet(self, provider: str) -> Tiers:
        p = self.config.get("providers", {}).get(provider)
        if not p:
            # An unknown cloud: price as the dearest known first tier (the safe side).
            rates = [t[0][1] for t in (self._internet(q) for q in self.config.get("providers", {}))] or [0.12]
            return ((float("inf"), max(rates)),)
        return tuple(
            (float("inf") if t.get("up_to_gib") is None else float(t["up_to_gib"]), float(t["usd_per_gib"]))
            for t in p["internet"]
        )

    def _route(self, s: Location, d: Location) -> tuple[Tiers, float]:
        bw = self.config.get("bandwidth_gbps", {})
        if _same_place(s, d):
            return _FREE, float(self.config.get("same_region", {}).get("gbps", bw.get("same_region", 10.0)))
        ss, ds = self._site(s), self._site(d)
        for a, b in ((ss, d), (ds, s)):
            if a is not None:
                for ln in a.links:
                    if ln.to == b.key:
                        return ((float("inf"), ln.usd_per_gib),), ln.gbps
        if ss is None and ds is None:
            if s.provider == d.provider and s.region == d.region:  # different known zones
                rate = float(self.config["providers"].get(s.provider, {}).get("cross_zone_usd_per_gib", 0.0))
                return ((float("inf"), rate),), float(bw.get("same_region", 10.0))
            if s.provider == d.provider and s.provider in self.config.get("providers", {}):
                ir = self.config["providers"][s.provider]["inter_region"]
                same = bool(s.continent) and s.continent == d.continent
                rate = _inter_region_rate(ir, s.continent, d.continent, same)
                g = bw.get("inter_region_same_continent" if same else "inter_region_cross_continent", 2.0)
                return ((float("inf"), rate),), float(g)
            return self._internet(s.provider), float(bw.get("internet", 1.0))
        internet_gbps = float(bw.get("internet", 1.0))
        if ss is not None and ds is not None:
            rate = ss.egress_usd_per_gib + ds.ingress_usd_per_gib
            return ((float("inf"), rate),), min(ss.uplink_gbps, ds.uplink_gbps, internet_gbps)
        if ss is not None:  # own site -> cloud: the site's egress; clouds do not charge ingress
            return ((float("inf"), ss.egress_usd_per_gib),), min(ss.uplink_gbps, internet_gbps)
        assert ds is not None  # cloud -> own site: the cloud's internet egress plus the site's ingress
        return _shift(self._internet(s.provider), ds.ingress_usd_per_gib), min(ds.uplink_gbps, internet_gbps)


def _inter_region_rate(ir: Mapping[str, Any], src: str, dst: str, same: bool) -> float:
    """USD per GiB between two regions of one cloud: the source continent's table (``by_source``: ``same``,
    then ``to[dst]``, then ``cross``), else the cloud's same/cross-continent default."""
    by = (ir.get("by_source") or {}).get(src) or {}
    if same:
        return float(by.get("same", ir["same_continent_usd_per_gib"]))
    to = by.get("to") or {}
    return float(to.get(dst, by.get("cross", ir["cross_continent_usd_per_gib"])))


def _same_place(s: Location, d: Location) -> bool:
    return s.provider == d.provider and s.region == d.region and (s.zone is None or d.zone is None or s.zone == d.zone)


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def load_egress(config_path: str | Path | None = None, *, sites: Iterable[Site] = ()) -> EgressModel:
    """The default egress model, with overrides from ``config_path`` (``None`` -> ``$BROKER_EGRESS_CONFIG``).

    The override file has the shape of ``egress-v1.yaml`` (any subset, merged key by key) plus an optional
    ``sites: {<provider:name>: {egress_usd_per_gib, ingress_usd_per_gib, uplink_gbps}}`` overriding sites.
    Raises :class:`SpecError` naming the file when it cannot be read or parsed."""
    base = yaml.safe_load(DEFAULT_EGRESS_PATH.read_text())
    if config_path is None:
        config_path = os.environ.get("BROKER_EGRESS_CONFIG") or None
    site_over: Mapping[str, Any] = {}
    if config_path is not None:
        p = Path(config_path)
        try:
            over = yaml.safe_load(p.read_text()) or {}
        except OSError as exc:
            raise SpecError(str(p), f"cannot read the egress config: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise SpecError(str(p), f"invalid YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(over, Mapping):
            raise SpecError(str(p), "the egress config must be a mapping")
        site_over = over.get("sites") or {}
        base = _merge(base, {k: v for k, v in over.items() if k != "sites"})
    model = EgressModel(base).with_sites(sites)
    if site_over:
        from dataclasses import replace

        fixed = []
        for key, vals in site_over.items():
            s = model.sites.get(key) or model._site(model.location(key))
            if s is None:
                raise SpecError(f"sites.{key}", "not an on-prem or edge site (use onprem:<name> or edge:<name>)")
            allowed = {"egress_usd_per_gib", "ingress_usd_per_gib", "uplink_gbps"}
            bad = set(vals) - allowed
            if bad:
                raise SpecError(f"sites.{key}.{sorted(bad)[0]}", f"unknown key; use {', '.join(sorted(allowed))}")
            s2 = s
            for k, v in vals.items():
                s2 = replace(s2, **{k: float(v)})  # type: ignore[arg-type]
            fixed.append(s2)
        model = model.with_sites(fixed)
    return model
