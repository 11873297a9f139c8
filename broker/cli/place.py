"""`broker place SPEC.yaml`: where each job of a spec file would run, and what it would cost.

Contract (``--json``): one JSON object per job (one line each when the file holds several)::

    {"job": NAME, "placement": OPTION | null, "alternatives": [OPTION, ...], "considered": INT,
     "feasible": INT, "rejected": {REASON: COUNT}, "explanation": SENTENCE}

Exit codes: 0 every job placed; 2 invalid spec (one line on stderr naming the field); 3 some job has no
feasible placement (its JSON still printed, ``placement: null``); 1 anything else (unreadable catalog).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from broker.errors import BrokerError, SpecError

if TYPE_CHECKING:
    from broker.model import PlacementResult
    from pricing import Catalog, EgressModel, Inventory

__all__ = ["register", "place_command", "load_world"]

EXIT_INVALID = 2
EXIT_INFEASIBLE = 3


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def load_world(catalog_dir: Path | None, inventory: Path | None, *,
               warn: bool = True) -> tuple[Catalog, EgressModel, Inventory]:
    """``(catalog, egress, inventory)`` as ``broker place`` uses them (catalog dir / inventory from the
    options or the ``BROKER_CATALOG_DIR`` / ``BROKER_INVENTORY`` / ``BROKER_EGRESS_CONFIG`` environment).
    With ``warn``, a catalog older than 30 days is said on stderr (``broker.cli.catalog.warn_if_stale``)."""
    from broker.cli.catalog import warn_if_stale
    from pricing import load_catalog, load_egress, load_inventory

    inv = load_inventory(inventory)
    catalog = load_catalog(catalog_dir)
    egress = load_egress(sites=inv.sites)
    if warn:
        warn_if_stale(catalog)
    return catalog, egress, inv


def place_command(
    spec: Annotated[Path, typer.Argument(help="Job spec file (YAML or JSON; several `---` documents allowed).")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the JSON contract instead of a table.")] = False,
    top: Annotated[int, typer.Option("--top", min=0, max=100, help="Number of ranked alternatives.")] = 5,
    catalog: Annotated[
        Path | None,
        typer.Option("--catalog", help="SkyPilot v8 catalog dir (<dir>/<provider>/vms.csv) merged over the "
                     "embedded one. Default: $BROKER_CATALOG_DIR."),
    ] = None,
    include_outliers: Annotated[
        bool, typer.Option("--include-outliers", help="Also consider offers flagged as price outliers.")
    ] = False,
    inventory: Annotated[
        Path | None, typer.Option("--inventory", help="On-prem inventory YAML. Default: $BROKER_INVENTORY or "
                                  "this machine as host `localhost`.")
    ] = None,
) -> None:
    """Place the jobs of SPEC where they are cheapest in total (compute + data egress + transfer time).

    Example: broker place examples/train-a100.yaml --top 3
    """
    from dataclasses import replace

    from broker.spec import load_spec_file
    from policies.placement import place

    try:
        cat, egress, inv = load_world(catalog, inventory, warn=False)  # warned once the spec is good
    except SpecError as exc:
        raise _fail(str(exc), EXIT_INVALID) from None
    except BrokerError as exc:
        raise _fail(str(exc), 1) from None
    site_keys = {s.key for s in inv.sites}
    try:
        specs = load_spec_file(spec, location_exists=lambda k: cat.has_location(k) or k in site_keys)
    except SpecError as exc:
        raise _fail(str(exc), EXIT_INVALID) from None
    from broker.cli.catalog import warn_if_stale

    warn_if_stale(cat)
    extra = inv.offers()
    results = []
    for js in specs:
        req = js.request
        if include_outliers and not req.include_outliers:
            req = replace(req, include_outliers=True)
        try:
            results.append(place(req, cat, egress, top=top, extra_offers=extra))
        except SpecError as exc:
            raise _fail(str(exc), EXIT_INVALID) from None
    if json_out:
        for r in results:
            sys.stdout.write(json.dumps({**r.to_dict(), "explanation": r.explanation}) + "\n")
    else:
        _print_tables(results, cat.version)
    if any(r.placement is None for r in results):
        raise typer.Exit(EXIT_INFEASIBLE)


def _print_tables(results: list[PlacementResult], version: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)
    for res in results:
        if res.placement is None:
            console.print(f"[bold]{res.job}[/]: [red]no feasible placement[/] ({res.considered} offers considered)")
            for reason, n in sorted(res.rejected.items(), key=lambda kv: -kv[1]):
                console.print(f"  {reason}: {n}")
            console.print(f"  {res.explanation}")
            continue
        t = Table(title=f"{res.job}: {res.feasible} feasible of {res.considered} offers (catalog {version})")
        for col, just in (("#", "right"), ("where", "left"), ("instance", "left"), ("capacity", "left"),
                          ("vCPU", "right"), ("GiB", "right"), ("GPU", "left"), ("$/h", "right"),
                          ("compute $", "right"), ("egress $", "right"), ("spot risk $", "right"),
                          ("transfer h", "right"), ("total $", "right")):
            t.add_column(col, justify=just)  # type: ignore[arg-type]
        for rank, o in enumerate((res.placement, *res.alternatives)):
            where = f"{o.provider}:{o.region}" + (f"/{o.zone}" if o.zone else "")
            gpu = f"{o.accelerator}x{o.gpus}" if o.gpus else "-"
            t.add_row(
                "best" if rank == 0 else str(rank), where, o.instance_type, o.capacity, f"{o.vcpus:g}",
                f"{o.memory_gib:g}", gpu, f"{o.hourly_usd:.4f}", f"{o.compute_usd:,.2f}", f"{o.egress_usd:,.2f}",
                f"{o.interruption_usd:,.2f}" if o.capacity == "spot" else "-", f"{o.transfer_hours:.2f}",
                f"{o.total_usd:,.2f}", style="bold green" if rank == 0 else None,
            )
        console.print(t)
        console.print(f"  {res.explanation}\n")


def register(app: typer.Typer) -> None:
    """Add `broker place` to the root app."""
    app.command("place")(place_command)
