"""`broker` CLI commands: providers (owned by the providers work; see broker/cli/__init__.py)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
