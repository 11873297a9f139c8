"""Live price refresh: pull instance types and prices from providers into a new, dated catalog version.

The new version is saved beside the bundled catalog by :class:`pricing.CatalogStore`; older versions are
kept, so placements that recorded a version are never re-priced with today's prices.

Provider options come from the environment (see docs/PROVIDERS.md): ``BROKER_AWS_REGIONS``,
``BROKER_AWS_ENDPOINT_URL``, ``BROKER_AWS_PRICE_LIST_URL``, ``BROKER_AZURE_REGIONS``,
``BROKER_AZURE_BASE_URL``, ``BROKER_AZURE_PRICES_URL``, ``BROKER_GCP_ZONES``, ``BROKER_GCP_ENDPOINT``,
``BROKER_GCP_BILLING_URL``, ``BROKER_GCP_TOKEN_CACHE``, ``BROKER_CA_BUNDLE`` (TLS trust for the endpoints above).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from broker.errors import CatalogError, InvalidRequestError, ProviderError
from broker.model import Offer, Provenance

from . import registry
from .base import Provider

__all__ = ["refresh_catalog", "options_from_env", "REFRESHABLE"]

REFRESHABLE = ("aws", "azure", "gcp")


class _Store(Protocol):
    def save(self, catalog: Any, label: str = "") -> str: ...


def _csv(value: str | None) -> list[str] | None:
    items = [v.strip() for v in (value or "").split(",") if v.strip()]
    return items or None


# Adapter option <- environment variable, per provider: (variable, option, is a comma list). The CA bundle
# option names differ by SDK, so it is listed per provider too.
_ENV_OPTIONS: Mapping[str, tuple[tuple[str, str, bool], ...]] = {
    "aws": (
        ("BROKER_AWS_REGIONS", "regions", True),
        ("BROKER_AWS_ENDPOINT_URL", "endpoint_url", False),
        ("BROKER_AWS_PRICE_LIST_URL", "price_list_url", False),
        ("BROKER_AWS_IMAGE_ID", "image_id", False),
        ("BROKER_MAX_RUNTIME_HOURS", "max_runtime_hours", False),
    ),
    "azure": (
        ("BROKER_AZURE_REGIONS", "regions", True),
        ("BROKER_AZURE_BASE_URL", "base_url", False),
        ("BROKER_AZURE_PRICES_URL", "prices_url", False),
        ("BROKER_CA_BUNDLE", "connection_verify", False),
        ("BROKER_AZURE_RESOURCE_GROUP", "resource_group", False),
        ("BROKER_AZURE_SUBNET_ID", "subnet_id", False),
        ("BROKER_AZURE_SSH_PUBLIC_KEY", "ssh_public_key", False),
        ("BROKER_AZURE_GPU_DRIVER", "gpu_driver", False),
        ("BROKER_MAX_RUNTIME_HOURS", "max_runtime_hours", False),
    ),
    "gcp": (
        ("BROKER_GCP_ZONES", "zones", True),
        ("BROKER_GCP_ENDPOINT", "endpoint", False),
        ("BROKER_GCP_BILLING_URL", "billing_url", False),
        ("BROKER_GCP_TOKEN_CACHE", "token_cache", False),
        ("BROKER_CA_BUNDLE", "ca_bundle", False),
        ("BROKER_GCP_NETWORK", "network", False),
        ("BROKER_GCP_SUBNETWORK", "subnetwork", False),
        ("BROKER_MAX_RUNTIME_HOURS", "max_runtime_hours", False),
    ),
}


def options_from_env(name: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Adapter options for provider ``name`` read from ``BROKER_<NAME>_*`` variables (unset ones omitted)."""
    e = os.environ if env is None else env
    opts: dict[str, Any] = {}
    for variable, option, is_list in _ENV_OPTIONS.get(name, ()):
        value: Any = _csv(e.get(variable)) if is_list else (e.get(variable) or None)
        if value and option == "max_runtime_hours":
            try:
                value = float(value)
            except ValueError:
                raise InvalidRequestError(f"{variable}={value!r} is not a number of hours. To fix: set it to "
                                          "e.g. 12.", provider=name) from None
            if not 0 < value <= 24 * 366:
                raise InvalidRequestError(f"{variable}={value!r} is out of range. To fix: use 0 < hours <= 8784.",
                                          provider=name)
        if value:
            opts[option] = value
    return opts


def _default_factory(name: str, **options: Any) -> Provider:
    return registry.create(name, **(options_from_env(name) | options))


def refresh_catalog(
    provider_names: Sequence[str],
    store: _Store,
    *,
    providers_factory: Callable[..., Provider] = _default_factory,
) -> str:
    """Pull offers from each named provider, save them as one new catalog version and return the version.

    All-or-nothing: when any provider fails, nothing is saved and its typed ``ProviderError`` is raised
    (the message says which provider; refresh the others with ``--provider``). Raises ``CatalogError`` when
    the providers returned no offer at all."""
    from pricing.catalog import Catalog

    names = list(dict.fromkeys(provider_names))
    if not names:
        raise CatalogError("no provider to refresh. To fix: pass --provider aws (or azure, gcp).")
    offers: list[Offer] = []
    provenances: list[Provenance] = []
    for name in names:
        provider = providers_factory(name)
        try:
            got = provider.offers()
        except ProviderError as exc:
            exc.message = f"refresh of {name} failed: {exc}"
            exc.args = (exc.message,)
            raise
        offers.extend(got)
        provenances.extend(getattr(provider, "last_provenance", []) or [])
    if not offers:
        raise CatalogError(
            f"the providers {', '.join(names)} returned no priced offer. To fix: check their regions and price "
            "sources (`broker providers check`)."
        )
    today = datetime.now(UTC)
    provenance = Provenance(
        source="refresh:" + ",".join(names) + (
            "" if not provenances else " (" + "; ".join(p.source for p in provenances) + ")"
        ),
        date=today.date().isoformat(),
        rows=sum(p.rows for p in provenances) or len(offers),
        offers=len(offers),
        dropped=sum(p.dropped for p in provenances),
        outliers=sum(p.outliers for p in provenances),
        provider=",".join(names),
    )
    catalog = Catalog.from_offers(offers, provenance)
    return store.save(catalog, label=f"refresh {today.isoformat(timespec='seconds')} {','.join(names)}")
