"""`broker` CLI commands: service (owned by the service work; see broker/cli/__init__.py)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
