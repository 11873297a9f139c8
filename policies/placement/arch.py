"""Filter: CPU architecture (``any`` accepts both)."""

from __future__ import annotations

from broker.model import Arch, Request
from policies.placement.base import Check, Context
from pricing.catalog import ARCHS, Catalog

NAME = "arch"
ArchMismatch = "ArchMismatch"
REASONS = (ArchMismatch,)


def checks(request: Request, catalog: Catalog, ctx: Context) -> list[Check]:
    if not request.arch or request.arch == Arch.ANY.value:
        return []
    code = ARCHS.index(request.arch) if request.arch in ARCHS else -1
    return [(ArchMismatch, catalog.arch_code == code)]
