"""pricing: the catalog of offers, the egress/bandwidth model and the on-prem/edge inventory.

Public API (see docs/CATALOG.md): :class:`Catalog`, :func:`load_catalog`, :class:`CatalogStore`,
:class:`EgressModel`, :func:`load_egress`, :class:`Site`, :class:`Host`, :class:`Inventory`,
:func:`load_inventory`. Import cost is numpy only; Libcloud is imported when the embedded catalog is built.
"""

from pricing.catalog import ARCHS, CAPACITIES, Catalog, CatalogBuilder, flag_outliers
from pricing.egress import EgressModel, load_egress
from pricing.embedded import load_embedded
from pricing.inventory import Host, Inventory, Site, load_inventory
from pricing.load import cache_dir, load_catalog
from pricing.skypilot import load_skypilot_csv, load_skypilot_dir
from pricing.store import CatalogStore

__all__ = [
    "ARCHS",
    "CAPACITIES",
    "Catalog",
    "CatalogBuilder",
    "CatalogStore",
    "EgressModel",
    "Host",
    "Inventory",
    "Site",
    "cache_dir",
    "flag_outliers",
    "load_catalog",
    "load_egress",
    "load_embedded",
    "load_inventory",
    "load_skypilot_csv",
    "load_skypilot_dir",
]
