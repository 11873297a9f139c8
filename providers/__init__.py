"""Provider adapters behind one small protocol: AWS, Azure, GCP, on-prem, fake and dry-run.

``import providers`` is light: it never imports boto3, azure or libcloud. Build adapters with
:func:`providers.registry.create` (lazy imports); provision with failover through
:func:`providers.failover.provision`.
"""

from __future__ import annotations

from .base import TAG_DRY_RUN, TAG_JOB, TAG_REQUEST, Capability, Provider, ProviderCheck
from .dryrun import DryRunProvider
from .errors import map_errors
from .failover import Blocklist, ProvisionOutcome, provision
from .fake import FakeProvider
from .onprem import OnPremPool
from .registry import check, create, names

__all__ = [
    "Capability",
    "Provider",
    "ProviderCheck",
    "TAG_JOB",
    "TAG_REQUEST",
    "TAG_DRY_RUN",
    "FakeProvider",
    "DryRunProvider",
    "OnPremPool",
    "Blocklist",
    "ProvisionOutcome",
    "provision",
    "map_errors",
    "create",
    "check",
    "names",
]
