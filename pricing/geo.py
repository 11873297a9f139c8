"""Region -> continent tags for AWS, Azure and GCP regions.

The egress and bandwidth model prices traffic by continent (``na``, ``sa``, ``eu``, ``as``, ``oc``, ``me``,
``af``); this module maps a provider's region name to its tag. Unknown regions map to ``""`` and are
priced as cross-continent (the dearer, safer assumption).
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["continent_of", "CONTINENTS"]

CONTINENTS = ("na", "sa", "eu", "as", "oc", "me", "af")

_AWS_PREFIX = (
    ("us-gov-", "na"), ("us-", "na"), ("ca-", "na"), ("mx-", "na"), ("sa-", "sa"), ("eu-", "eu"),
    ("ap-southeast-2", "oc"), ("ap-southeast-4", "oc"), ("ap-southeast-6", "oc"), ("ap-", "as"),
    ("cn-", "as"), ("me-", "me"), ("il-", "me"), ("af-", "af"),
)
_GCP_PREFIX = (
    ("us-", "na"), ("northamerica-", "na"), ("southamerica-", "sa"), ("europe-", "eu"), ("asia-", "as"),
    ("australia-", "oc"), ("me-", "me"), ("africa-", "af"),
)
# Azure region names are run-together words; the first matching fragment decides.
_AZURE_FRAGMENTS = (
    ("newzealand", "oc"), ("australia", "oc"), ("southafrica", "af"), ("uae", "me"), ("qatar", "me"),
    ("israel", "me"), ("saudi", "me"), ("brazil", "sa"), ("chile", "sa"), ("mexico", "na"),
    ("canada", "na"), ("usgov", "na"), ("usdod", "na"), ("europe", "eu"), ("uk", "eu"), ("france", "eu"),
    ("germany", "eu"), ("switzerland", "eu"), ("norway", "eu"), ("sweden", "eu"), ("poland", "eu"),
    ("italy", "eu"), ("spain", "eu"), ("austria", "eu"), ("belgium", "eu"), ("denmark", "eu"),
    ("finland", "eu"), ("greece", "eu"), ("asia", "as"), ("japan", "as"), ("korea", "as"), ("india", "as"),
    ("indonesia", "as"), ("malaysia", "as"), ("taiwan", "as"), ("china", "as"), ("singapore", "as"),
    ("us", "na"),
)


@lru_cache(maxsize=4096)
def continent_of(provider: str, region: str) -> str:
    """The continent tag of a cloud region, or ``""`` when the region is not recognised."""
    r = region.lower()
    if provider == "aws":
        table: tuple[tuple[str, str], ...] = _AWS_PREFIX
        return next((c for p, c in table if r.startswith(p)), "")
    if provider == "gcp":
        return next((c for p, c in _GCP_PREFIX if r.startswith(p)), "")
    if provider == "azure":
        return next((c for p, c in _AZURE_FRAGMENTS if p in r), "")
    return ""
