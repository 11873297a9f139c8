"""`broker providers check` (which providers are usable from here, like `sky check`) and
`broker catalog refresh` (pull live prices into a new catalog version).

Both exit 0 when things are merely not configured; bad input prints one line on stderr and exits 2;
a provider failure during refresh prints one line and exits 1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from broker.errors import BrokerError

__all__ = ["register", "providers_app", "check_command", "refresh"]

providers_app = typer.Typer(
    name="providers",
    help="Cloud, on-prem and dry-run providers: which are usable and why not.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@providers_app.command("check")
def check_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Show which providers are usable (credentials found in each cloud's standard chain) and why not.

    Clouds without credentials are still placed on, in dry-run mode. Makes no network call."""
    from providers.registry import check

    results = check()
    if as_json:
        typer.echo(json.dumps([
            {"name": c.name, "usable": c.usable, "reason": c.reason, "credentials_source": c.credentials_source}
            for c in results
        ], indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Providers", show_lines=False)
    table.add_column("provider", style="bold")
    table.add_column("usable")
    table.add_column("credentials / why not", overflow="fold")
    for c in results:
        mark = "[green]yes[/green]" if c.usable else "[yellow]no (dry-run)[/yellow]"
        table.add_row(c.name, mark, c.credentials_source if c.usable else c.reason)
    Console(width=max(100, int(os.environ.get("COLUMNS", "100") or 100))).print(table)
    usable = [c.name for c in results if c.usable]
    typer.echo(f"{len(usable)} of {len(results)} providers usable: {', '.join(usable) or 'none'}")


def refresh(
    provider: Annotated[
        list[str] | None,
        typer.Option("--provider", "-p", help="aws, azure or gcp (repeatable). Default: all clouds."),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="Where catalog versions are kept. Default: $BROKER_DATA_DIR."),
    ] = None,
) -> None:
    """Pull instance types and prices from providers into a new, dated catalog version.

    Older versions are kept, so past placements are never re-priced. Endpoints and regions come from
    BROKER_AWS_*, BROKER_AZURE_*, BROKER_GCP_* (docs/PROVIDERS.md)."""
    from providers.refresh import REFRESHABLE, refresh_catalog

    names = provider or list(REFRESHABLE)
    unknown = [n for n in names if n not in REFRESHABLE]
    if unknown:
        typer.echo(f"error: cannot refresh {unknown[0]!r}. To fix: use --provider with one of "
                   f"{', '.join(REFRESHABLE)}.", err=True)
        raise typer.Exit(2)
    from broker.config import load_settings
    from pricing import CatalogStore

    root = data_dir if data_dir is not None else load_settings().data_dir
    store = CatalogStore(root)
    try:
        version = refresh_catalog(names, store)
    except BrokerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"catalog version {version} saved in {store.root} ({', '.join(names)})")


def register(app: typer.Typer) -> None:
    """Add ``broker providers ...`` and ``broker catalog refresh`` to the root app."""
    app.add_typer(providers_app, name="providers")
    from broker.cli.catalog import catalog_app

    catalog_app.command("refresh")(refresh)
