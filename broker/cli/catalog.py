"""`broker catalog offers|info`: browse the price catalog and see where its data came from.

The group is the module-level ``catalog_app`` so that other modules can add commands to it
(``broker catalog refresh`` lives in broker/cli/providers.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.errors import BrokerError

if TYPE_CHECKING:
    from pricing import Catalog

__all__ = ["catalog_app", "register", "parse_gpu"]

catalog_app = typer.Typer(
    name="catalog",
    help="Browse the price catalog (embedded Libcloud data merged with SkyPilot v8 catalogs).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

CatalogOpt = Annotated[
    Path | None,
    typer.Option("--catalog", help="SkyPilot v8 catalog dir merged over the embedded one. "
                 "Default: $BROKER_CATALOG_DIR."),
]
_GPU_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?::(\d+))?$")


def warn_if_stale(cat: Catalog) -> None:
    """One stderr line when the catalog's prices are older than 30 days."""
    from pricing.freshness import stale_warning

    warning = stale_warning(cat)
    if warning:
        typer.echo(warning, err=True)


def parse_gpu(text: str) -> tuple[str, int]:
    """``MODEL[:N]`` -> ``(MODEL, N)`` (N defaults to 1). Raises ``ValueError`` with a readable message."""
    m = _GPU_RE.match(text.strip())
    if not m or (m.group(2) is not None and int(m.group(2)) < 1):
        raise ValueError(f"--gpu {text!r} is not MODEL[:N] with N >= 1 (e.g. A100:8)")
    return m.group(1), int(m.group(2) or 1)


def _load(catalog: Path | None, *, warn: bool = True) -> Catalog:
    from pricing import load_catalog

    try:
        cat = load_catalog(catalog)
    except BrokerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if warn:
        warn_if_stale(cat)
    return cat


@catalog_app.command("offers")
def offers_command(
    provider: Annotated[list[str] | None, typer.Option("--provider", help="aws, azure or gcp (repeatable).")] = None,
    region: Annotated[list[str] | None, typer.Option("--region", help="Region name or provider:region "
                                                      "(repeatable).")] = None,
    min_vcpus: Annotated[float, typer.Option("--min-vcpus", min=0, help="At least this many vCPUs.")] = 0,
    min_memory: Annotated[float, typer.Option("--min-memory", min=0, help="At least this much memory (GiB).")] = 0,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Accelerator MODEL[:N], e.g. A100:8 or T4.")] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Spot offers instead of on-demand.")] = False,
    include_outliers: Annotated[bool, typer.Option("--include-outliers", help="Show flagged outliers too.")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100000, help="Rows to show, cheapest first.")] = 20,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
    catalog: CatalogOpt = None,
) -> None:
    """List the cheapest offers matching the filters.

    Example: broker catalog offers --gpu A100:8 --provider gcp --limit 5
    """
    acc, n = None, 0
    if gpu is not None:
        try:
            acc, n = parse_gpu(gpu)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    cat = _load(catalog, warn=False)  # a usage error stays one line; the age warning comes once it is valid
    if acc is not None and cat.accelerator_code(acc) is None:
        known = ", ".join(sorted(a for a in cat.accelerators if a))
        typer.echo(f"error: --gpu: no offer carries accelerator {acc!r}. To fix: use one of {known}", err=True)
        raise typer.Exit(2)
    warn_if_stale(cat)
    idx = cat.query(
        min_vcpus=min_vcpus, min_memory_gib=min_memory, gpus=n, accelerator=acc, providers=tuple(provider or ()),
        regions=tuple(region or ()), capacities=("spot",) if spot else ("on-demand",),
        include_outliers=include_outliers,
    )
    if len(idx) == 0:
        typer.echo(f"error: no offer matches. {_lacks(cat, acc, n, tuple(provider or ()), spot)}", err=True)
        raise typer.Exit(1)
    rows = idx[:limit]  # the catalog is sorted by price: the first rows are the cheapest
    if json_out:
        out = []
        for i in rows:
            o = cat.offer(int(i))
            it = o.instance_type
            out.append({
                "provider": o.provider, "region": o.region, "zone": o.location.zone, "instance_type": it.name,
                "capacity": o.capacity.value, "vcpus": it.vcpus, "memory_gib": it.memory_gib, "gpus": it.gpus,
                "accelerator": it.accelerator, "arch": it.arch, "hourly_usd": o.hourly_usd,
                "outlier": bool(cat.outlier[int(i)]), "outlier_reason": cat.outlier_reason(int(i)),
                "source": o.source,
            })
        sys.stdout.write(json.dumps(out) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{len(idx)} matching offers (showing {len(rows)}, cheapest first; catalog {cat.version})")
    for col, just in (("provider", "left"), ("region", "left"), ("zone", "left"), ("instance", "left"),
                      ("vCPU", "right"), ("GiB", "right"), ("GPU", "left"), ("arch", "left"), ("$/h", "right"),
                      ("source", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for i in rows:
        o = cat.offer(int(i))
        it = o.instance_type
        t.add_row(o.provider, o.region, o.location.zone or "-", it.name, f"{it.vcpus:g}", f"{it.memory_gib:g}",
                  f"{it.accelerator}x{it.gpus}" if it.gpus else "-", it.arch,
                  f"{o.hourly_usd:.4f}" + (" (outlier)" if cat.outlier[int(i)] else ""), o.source)
    Console(width=None if sys.stdout.isatty() else 200).print(t)


def _lacks(cat: Any, acc: str | None, n: int, providers: tuple[str, ...], spot: bool) -> str:
    """One sentence on what the catalog lacks for an empty query: per asked (or known) cloud, whether it has
    the accelerator (at that count) and the capacity at all."""
    import numpy as np

    capacity = "spot" if spot else "on-demand"
    cap_code = 1 if spot else 0
    parts = []
    for prov in providers or tuple(p for p in cat.providers if p in ("aws", "azure", "gcp")):
        if prov not in cat.providers:
            parts.append(f"{prov}: no offers at all")
            continue
        rows = cat.provider_code == cat.providers.index(prov)
        if not (rows & (cat.cap_code == cap_code)).any():
            parts.append(f"{prov}: no {capacity} offers")
            continue
        code = cat.accelerator_code(acc) if acc else None
        if acc and (code is None or not (rows & (cat.acc_code == code)).any()):
            parts.append(f"{prov}: no {acc} offers")
        elif acc and not (rows & (cat.acc_code == code) & (cat.gpus >= n)).any():
            most = int(np.max(cat.gpus[rows & (cat.acc_code == code)]))
            parts.append(f"{prov}: {acc} at most {most} per instance")
        elif acc and not (rows & (cat.acc_code == code) & (cat.cap_code == cap_code)).any():
            parts.append(f"{prov}: {acc} but no {capacity} {acc} offers")
        else:
            parts.append(f"{prov}: has {capacity} offers, none with these resources/regions")
        gone = _superseded_types(cat, prov, acc, capacity)
        if gone:
            parts[-1] += (f" ({', '.join(gone)}: Libcloud's rows left out, their list price changed later; "
                          "see docs/CATALOG.md)")
    versions = f"catalog {cat.version}"
    return ("; ".join(parts) + f" ({versions}). To fix: widen the filters, or load a catalog that has them "
            "(broker catalog refresh, --catalog DIR)")


def _superseded_types(cat: Any, provider: str, acc: str | None, capacity: str) -> list[str]:
    """Instance types of ``provider`` (with accelerator ``acc`` when given) whose embedded rows were left out
    as superseded by a dated price change, when the catalog counts any."""
    if not any(p.provider == provider and p.superseded for p in cat.provenance):
        return []
    from pricing.embedded import load_price_changes

    return sorted(ch.instance_type for ch in load_price_changes()
                  if ch.provider == provider and ch.capacity == capacity
                  and (acc is None or ch.accelerator.upper() == acc.upper()))


@catalog_app.command("info")
def info_command(
    catalog: CatalogOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Per provider and source: offers, regions, outliers, duplicates merged, rows dropped, date."""
    import numpy as np

    cat = _load(catalog)
    rows = []
    for p in cat.provenance:
        sel = np.ones(len(cat), dtype=bool)
        if p.provider in cat.providers:
            sel &= cat.provider_code == cat.providers.index(p.provider)
        sel &= cat.src_code == (cat.sources.index(p.source) if p.source in cat.sources else -1)
        regions = len(np.unique(cat.loc_code[sel])) if sel.any() else 0
        rows.append({
            "provider": p.provider, "source": p.source, "date": p.date, "rows": p.rows, "offers": p.offers,
            "regions": regions, "outliers": p.outliers, "duplicates": p.duplicates, "dropped": p.dropped,
            "superseded": p.superseded,
        })
    if json_out:
        sys.stdout.write(json.dumps({"version": cat.version, "offers": len(cat), "sources": rows}) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"catalog {cat.version}: {len(cat)} offers in {len(cat.locations)} locations")
    cols = ("provider", "source", "date", "rows", "offers", "regions", "outliers", "duplicates", "dropped",
            "superseded")
    for c in cols:
        t.add_column(c, justify="left" if c in ("provider", "source", "date") else "right")
    for r in rows:
        t.add_row(*(str(r[c]) for c in cols))
    Console(width=None if sys.stdout.isatty() else 200).print(t)
    Console(width=None if sys.stdout.isatty() else 200).print(
        "offers = rows in use after merging (a loaded catalog replaces embedded prices); "
        "outliers are skipped by placement unless --include-outliers; superseded = rows left out because "
        "their list price changed later (pricing/data/price-changes.csv)."
    )


def register(app: typer.Typer) -> None:
    """Add the `broker catalog` group to the root app."""
    app.add_typer(catalog_app, name="catalog")
