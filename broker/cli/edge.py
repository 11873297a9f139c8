"""`broker` CLI commands: edge (owned by the edge work; see broker/cli/__init__.py)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root app."""
