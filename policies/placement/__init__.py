"""Placement: where a job should run, cheapest in total, as small pure plugins over the columnar catalog.

``place(request, catalog, egress, *, top=5, now=None, extra_offers=(), wait_hours=0.0) -> PlacementResult``

Filters (applied in this order; each rejected offer counts under its first failing reason): allowlist
(``ProviderNotAllowed``, ``RegionNotAllowed``), spot (``SpotPolicy``), arch (``ArchMismatch``),
accelerator (``AcceleratorMismatch``), fit (``InsufficientVCPUs``, ``InsufficientMemory``,
``InsufficientGPUs``), burstable (``BurstableType``), topology (``InterconnectMismatch``), outlier
(``Outlier``), price_cap (``OverPriceCap``), then deadline (``DeadlineMiss``) after costing. Scores:
``cost`` and ``time``.
See docs/PLACEMENT.md.
"""

from policies.placement.accelerator import AcceleratorMismatch
from policies.placement.allowlist import ProviderNotAllowed, RegionNotAllowed
from policies.placement.arch import ArchMismatch
from policies.placement.base import Context, Costs, Verdict
from policies.placement.burstable import BurstableType
from policies.placement.deadline import DeadlineMiss
from policies.placement.engine import FILTERS, REASONS, SCORES, check_offer, place
from policies.placement.explain import describe, explain
from policies.placement.fit import InsufficientGPUs, InsufficientMemory, InsufficientVCPUs
from policies.placement.outlier import Outlier
from policies.placement.price_cap import OverPriceCap
from policies.placement.spot import SpotPolicyReason
from policies.placement.topology import InterconnectMismatch

SpotPolicy = SpotPolicyReason  # the reason constant's public name ("SpotPolicy")

__all__ = [
    "FILTERS",
    "REASONS",
    "SCORES",
    "AcceleratorMismatch",
    "ArchMismatch",
    "BurstableType",
    "Context",
    "Costs",
    "DeadlineMiss",
    "InsufficientGPUs",
    "InsufficientMemory",
    "InsufficientVCPUs",
    "InterconnectMismatch",
    "Outlier",
    "OverPriceCap",
    "ProviderNotAllowed",
    "RegionNotAllowed",
    "SpotPolicy",
    "Verdict",
    "check_offer",
    "describe",
    "explain",
    "place",
]
