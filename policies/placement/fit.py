"""Filter: the instance has at least the requested vCPUs, memory and GPUs per node."""

from __future__ import annotations

import numpy as np

from broker.model import Request
from policies.placement.base import Check, Context
from pricing.catalog import Catalog

NAME = "fit"
InsufficientVCPUs = "InsufficientVCPUs"
InsufficientMemory = "InsufficientMemory"
InsufficientGPUs = "InsufficientGPUs"
REASONS = (InsufficientVCPUs, InsufficientMemory, InsufficientGPUs)


def wanted_gpus(request: Request) -> int:
    """GPUs per node: the request's count, at least 1 when it names an accelerator."""
    return max(request.gpus, 1 if request.accelerator else 0)


def checks(request: Request, catalog: Catalog, ctx: Context) -> list[Check]:
    out: list[Check] = []
    if request.vcpus > 0:
        out.append((InsufficientVCPUs, catalog.vcpus >= np.float32(request.vcpus) - np.float32(1e-6)))
    if request.memory_gib > 0:
        out.append((InsufficientMemory, catalog.memory_gib >= np.float32(request.memory_gib) - np.float32(1e-3)))
    g = wanted_gpus(request)
    if g:
        out.append((InsufficientGPUs, catalog.gpus >= g))
    return out
