"""Filter: the GPU interconnect a request names (``placement.interconnect``).

``nvswitch`` needs all GPUs of the instance on one NVSwitch fabric; ``nvlink`` accepts NVLink or NVSwitch.
The catalogs do not carry it, so it is derived from the instance type name by the published families below
(a conservative list: an unknown type never qualifies).
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from broker.model import Request
from policies.placement.base import Check, Context
from pricing.catalog import Catalog

NAME = "topology"
InterconnectMismatch = "InterconnectMismatch"
REASONS = (InterconnectMismatch,)

_NVSWITCH = re.compile(
    r"^(p4d\.|p4de\.|p5\.|p5e\.|p5en\.|p6-b200\.|a2-highgpu-8g|a2-megagpu-16g|a2-ultragpu-8g|a3-\w+-8g|a4-\w+-8g"
    r"|Standard_ND96)",
)
_NVLINK = re.compile(r"^(p3\.(8|16)xlarge|p3dn\.|a2-highgpu-[24]g|a2-ultragpu-[24]g|Standard_ND40rs_v2)")
_RANK = {"nvlink": 1, "nvswitch": 2}


def interconnect_of(type_name: str) -> str | None:
    """``nvswitch``, ``nvlink`` or ``None`` for an instance type name."""
    if _NVSWITCH.match(type_name):
        return "nvswitch"
    if _NVLINK.match(type_name):
        return "nvlink"
    return None


@lru_cache(maxsize=8)
def type_levels(type_names: tuple[str, ...]) -> np.ndarray:
    """Interconnect level per type name (0 none, 1 NVLink, 2 NVSwitch), as int8."""
    return np.array([_RANK.get(interconnect_of(t) or "", 0) for t in type_names], dtype=np.int8)


def checks(request: Request, catalog: Catalog, ctx: Context) -> list[Check]:
    if not request.interconnect:
        return []
    need = _RANK.get(request.interconnect.lower(), 3)  # an unknown kind matches nothing
    levels = type_levels(tuple(catalog.type_names))
    return [(InterconnectMismatch, levels.take(catalog.type_code) >= need)]
