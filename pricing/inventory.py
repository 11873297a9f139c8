"""The on-prem and edge inventory: own sites (with their uplinks and links to clouds) and hosts.

YAML shape (``BROKER_INVENTORY`` or ``--inventory``)::

    sites:
      - {name: rack-a, continent: eu, uplink_gbps: 10, egress_usd_per_gib: 0,
         links: [{to: aws:eu-west-1, gbps: 10, usd_per_gib: 0.02}]}
    hosts:
      - {name: localhost, site: local, vcpus: auto, memory_gib: auto, gpus: 0, owned_usd_per_hour: 0}

With no file the inventory is one site ``local`` and one host ``localhost`` sized from this machine.
Each host becomes an ``owned`` offer at location ``onprem:<site>`` (``edge:<site>`` for edge sites).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from broker.errors import SpecError
from broker.model import Capacity, InstanceType, Location, Offer, SiteKind
from pricing.geo import CONTINENTS

__all__ = ["Site", "Link", "Host", "Inventory", "load_inventory", "local_inventory"]


@dataclass(frozen=True, slots=True)
class Link:
    """A dedicated link from a site to a location key (``aws:eu-west-1``); overrides price and bandwidth of
    traffic between the two, both directions."""

    to: str
    gbps: float
    usd_per_gib: float = 0.0


@dataclass(frozen=True, slots=True)
class Site:
    """An own site. ``provider`` is ``onprem`` or ``edge``; traffic leaving it costs ``egress_usd_per_gib``
    and entering it ``ingress_usd_per_gib``; ``uplink_gbps`` caps any transfer to or from it."""

    name: str
    provider: str = "onprem"
    continent: str = ""
    uplink_gbps: float = 1.0
    egress_usd_per_gib: float = 0.0
    ingress_usd_per_gib: float = 0.0
    latency_ms: float | None = None
    links: tuple[Link, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.provider}:{self.name}"

    @property
    def location(self) -> Location:
        return Location(self.provider, self.name, None, SiteKind(self.provider), self.continent)


@dataclass(frozen=True, slots=True)
class Host:
    """One own machine at ``site``. ``local`` hosts run work on this very machine."""

    name: str
    site: str
    vcpus: float
    memory_gib: float
    gpus: int = 0
    accelerator: str | None = None
    arch: str = "amd64"
    owned_usd_per_hour: float = 0.0
    local: bool = False


@dataclass(frozen=True)
class Inventory:
    sites: tuple[Site, ...] = ()
    hosts: tuple[Host, ...] = ()
    _by_name: Mapping[str, Site] = field(default_factory=dict, repr=False, compare=False)

    def site(self, name: str) -> Site:
        for s in self.sites:
            if s.name == name:
                return s
        raise KeyError(name)

    def offers(self) -> list[Offer]:
        """One ``owned`` offer per host, at ``<provider>:<site>``, priced ``owned_usd_per_hour``."""
        out = []
        for h in self.hosts:
            s = self.site(h.site)
            it = InstanceType(h.name, h.vcpus, h.memory_gib, h.gpus, h.accelerator, arch=h.arch)
            out.append(Offer(it, s.location, Capacity.OWNED, h.owned_usd_per_hour, source="inventory"))
        return out


def _machine() -> tuple[float, float, str]:
    vcpus = float(os.cpu_count() or 1)
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem = 1.0
    arch = "arm64" if os.uname().machine in ("aarch64", "arm64") else "amd64"
    return vcpus, round(mem, 2), arch


def local_inventory() -> Inventory:
    """One site ``local`` and one host ``localhost`` sized from this machine."""
    vcpus, mem, arch = _machine()
    return Inventory(sites=(Site("local"),), hosts=(Host("localhost", "local", vcpus, mem, arch=arch, local=True),))


def _num(v: Any, field_: str, lo: float = 0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or v < lo or v != v:
        raise SpecError(field_, f"must be a number >= {lo}, got {v!r}")
    return float(v)


def _parse(doc: Any, src: str) -> Inventory:
    if not isinstance(doc, Mapping):
        raise SpecError(src, "an inventory is a mapping with `sites` and `hosts`")
    unknown = set(doc) - {"sites", "hosts"}
    if unknown:
        raise SpecError(f"{src}.{sorted(unknown)[0]}", "unknown key; use sites and hosts")
    sites: list[Site] = []
    for i, s in enumerate(doc.get("sites") or []):
        f = f"sites[{i}]"
        if not isinstance(s, Mapping) or not isinstance(s.get("name"), str) or not s.get("name"):
            raise SpecError(f"{f}.name", "each site needs a name")
        extra = set(s) - {"name", "provider", "kind", "continent", "uplink_gbps", "egress_usd_per_gib",
                          "ingress_usd_per_gib", "latency_ms", "links"}
        if extra:
            raise SpecError(f"{f}.{sorted(extra)[0]}", "unknown key")
        prov = str(s.get("provider", s.get("kind", "onprem")))
        if prov not in ("onprem", "edge"):
            raise SpecError(f"{f}.provider", f"must be onprem or edge, got {prov!r}")
        cont = str(s.get("continent", ""))
        if cont and cont not in CONTINENTS:
            raise SpecError(f"{f}.continent", f"must be one of {', '.join(CONTINENTS)}")
        links = []
        for j, ln in enumerate(s.get("links") or []):
            if not isinstance(ln, Mapping) or ":" not in str(ln.get("to", "")):
                raise SpecError(f"{f}.links[{j}].to", "a link needs `to: provider:region`")
            links.append(Link(str(ln["to"]), _num(ln.get("gbps", 1.0), f"{f}.links[{j}].gbps", 1e-6),
                              _num(ln.get("usd_per_gib", 0.0), f"{f}.links[{j}].usd_per_gib")))
        sites.append(Site(
            name=s["name"], provider=prov, continent=cont,
            uplink_gbps=_num(s.get("uplink_gbps", 1.0), f"{f}.uplink_gbps", 1e-6),
            egress_usd_per_gib=_num(s.get("egress_usd_per_gib", 0.0), f"{f}.egress_usd_per_gib"),
            ingress_usd_per_gib=_num(s.get("ingress_usd_per_gib", 0.0), f"{f}.ingress_usd_per_gib"),
            latency_ms=None if s.get("latency_ms") is None else _num(s["latency_ms"], f"{f}.latency_ms"),
            links=tuple(links),
        ))
    names = {s.name for s in sites}
    vcpus_auto, mem_auto, arch_auto = _machine()
    hosts: list[Host] = []
    for i, h in enumerate(doc.get("hosts") or []):
        f = f"hosts[{i}]"
        if not isinstance(h, Mapping) or not isinstance(h.get("name"), str):
            raise SpecError(f"{f}.name", "each host needs a name")
        site = str(h.get("site", "local"))
        if site not in names:
            if site == "local":
                sites.append(Site("local"))
                names.add("local")
            else:
                raise SpecError(f"{f}.site", f"site {site!r} is not defined under sites")
        local = bool(h.get("local", h["name"] == "localhost"))
        vc = vcpus_auto if h.get("vcpus", "auto") == "auto" else _num(h.get("vcpus"), f"{f}.vcpus", 0.001)
        mem = mem_auto if h.get("memory_gib", "auto") == "auto" else _num(h.get("memory_gib"), f"{f}.memory_gib",
                                                                           0.001)
        hosts.append(Host(
            name=h["name"], site=site, vcpus=vc, memory_gib=mem, gpus=int(_num(h.get("gpus", 0), f"{f}.gpus")),
            accelerator=h.get("accelerator"), arch=str(h.get("arch", arch_auto)),
            owned_usd_per_hour=_num(h.get("owned_usd_per_hour", 0.0), f"{f}.owned_usd_per_hour"), local=local,
        ))
    return Inventory(tuple(sites), tuple(hosts))


def load_inventory(path: str | Path | None = None) -> Inventory:
    """The inventory from ``path`` (``None`` -> ``$BROKER_INVENTORY`` or :func:`local_inventory`).
    Raises :class:`SpecError` naming the field when the file is invalid."""
    if path is None:
        path = os.environ.get("BROKER_INVENTORY") or None
    if path is None:
        return local_inventory()
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise SpecError(str(p), f"cannot read the inventory: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SpecError(str(p), f"invalid YAML: {str(exc).splitlines()[0]}") from None
    return _parse(doc or {}, str(p))

