"""How old the prices of a catalog are: every figure the broker shows is only as true as its date.

A provider's prices date from its newest dated source in the catalog (``Provenance.date``); when that is more
than ``MAX_AGE_DAYS`` (30) days old, the CLI warns once on stderr and names the way to be current:
``broker catalog refresh`` (the providers' public price APIs; docs/CATALOG.md).
"""

from __future__ import annotations

from datetime import UTC, date, datetime

from pricing.catalog import Catalog

__all__ = ["MAX_AGE_DAYS", "stale_providers", "stale_warning"]

MAX_AGE_DAYS = 30


def stale_providers(cat: Catalog, *, today: date | None = None,
                    max_age_days: int = MAX_AGE_DAYS) -> list[tuple[str, str, int]]:
    """``(provider, date, age in days)`` of every cloud whose newest price source is older than
    ``max_age_days`` (an undated cloud counts as stale with date ``"undated"`` and age -1), sorted."""
    today = today or datetime.now(UTC).date()
    newest: dict[str, str] = {}
    for p in cat.provenance:
        if p.provider in ("aws", "azure", "gcp"):
            newest[p.provider] = max(newest.get(p.provider, ""), p.date[:10] if p.date else "")
    out = []
    for provider, d in sorted(newest.items()):
        if not d:
            out.append((provider, "undated", -1))
            continue
        age = (today - date.fromisoformat(d)).days
        if age > max_age_days:
            out.append((provider, d, age))
    return out


def stale_warning(cat: Catalog, *, today: date | None = None) -> str | None:
    """One line for stderr when some cloud's prices are older than 30 days, else ``None``."""
    old = stale_providers(cat, today=today)
    if not old:
        return None
    parts = ", ".join(f"{p} {d}" + (f" ({a} days)" if a >= 0 else "") for p, d, a in old)
    return (f"warning: catalog prices older than {MAX_AGE_DAYS} days: {parts}. To be current: broker catalog "
            "refresh (or --catalog DIR with newer SkyPilot v8 files)")
