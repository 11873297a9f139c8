"""Filter: the accelerator model, matched exactly and case-insensitively (``A100`` is not ``A100-80GB``).
A request naming a model without a count asks for at least one."""

from __future__ import annotations

import numpy as np

from broker.model import Request
from policies.placement.base import Check, Context
from pricing.catalog import Catalog

NAME = "accelerator"
AcceleratorMismatch = "AcceleratorMismatch"
REASONS = (AcceleratorMismatch,)


def checks(request: Request, catalog: Catalog, ctx: Context) -> list[Check]:
    if not request.accelerator:
        return []
    code = catalog.accelerator_code(request.accelerator)
    if code is None:
        return [(AcceleratorMismatch, np.zeros(len(catalog), dtype=bool))]
    return [(AcceleratorMismatch, catalog.acc_code == code)]
