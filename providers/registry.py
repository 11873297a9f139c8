"""Provider names -> factories, with lazy SDK imports, and the credentials check behind
``broker providers check``.

``import providers`` never imports boto3, azure or libcloud: each factory imports its adapter module
when called. :func:`check` only looks for credentials in each cloud's standard chain (it makes no
network call), so it is fast and works offline.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.errors import AuthError, InvalidRequestError

from .base import Provider, ProviderCheck

__all__ = ["names", "create", "check", "register", "CLOUDS", "POOLS"]

CLOUDS = ("aws", "azure", "gcp")
# On-prem pools on an existing engine (built with the broker's data_dir; their offers join every placement).
POOLS = ("slurm", "ray")

# name -> "module:attribute" (imported lazily) or a factory.
_FACTORIES: dict[str, str | Callable[..., Provider]] = {
    "aws": "providers.aws:AwsProvider",
    "azure": "providers.azure:AzureProvider",
    "gcp": "providers.gcp:GcpProvider",
    "onprem": "providers.onprem:OnPremPool",
    "slurm": "providers.slurm:SlurmPool",
    "ray": "providers.ray_engine:RayPool",
    "fake": "providers.fake:FakeProvider",
    "dryrun": "providers.dryrun:DryRunProvider",
}


def names() -> list[str]:
    """Every registered provider name, sorted."""
    return sorted(_FACTORIES)


def register(name: str, factory: str | Callable[..., Provider]) -> None:
    """Add or replace a provider factory (``"module:attr"`` or a callable returning a Provider)."""
    _FACTORIES[name] = factory


def create(name: str, **options: Any) -> Provider:
    """Build provider ``name`` with adapter ``options`` (see each adapter's constructor).

    Raises ``InvalidRequestError`` for an unknown name and ``AuthError`` when the adapter's SDK is not
    installed (the message names the extra to install)."""
    target = _FACTORIES.get(name)
    if target is None:
        raise InvalidRequestError(
            f"unknown provider {name!r}. To fix: use one of {', '.join(names())}.", provider=name
        )
    if callable(target):
        return target(**options)
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if (exc.name or "").startswith("providers"):
            raise InvalidRequestError(
                f"provider {name!r} has no adapter in this build yet ({exc.name}). To fix: use "
                "`dryrun` for it, or one of aws, azure, gcp, onprem.",
                provider=name,
            ) from exc
        extra = {"aws": "aws", "azure": "azure", "gcp": "gcp", "ray": "ray"}.get(name, "server")
        raise AuthError(
            f"provider {name!r} needs a package that is not installed ({exc.name}). "
            f"To fix: pip install 'hybrid-broker[{extra}]'.",
            provider=name,
        ) from exc
    factory: Callable[..., Provider] = getattr(module, attr)
    return factory(**options)


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _check_aws() -> ProviderCheck:
    if not _has("boto3"):
        return ProviderCheck("aws", False, "boto3 is not installed. To fix: pip install 'hybrid-broker[aws]'.")
    import botocore.session

    try:
        creds = botocore.session.Session().get_credentials()
    except Exception as exc:  # noqa: BLE001 - a broken profile is "not usable", with its reason
        return ProviderCheck("aws", False, f"credentials could not be read: {exc}. To fix: check ~/.aws.")
    if creds is None:
        return ProviderCheck(
            "aws",
            False,
            "no AWS credentials found. To fix: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, "
            "or run on an instance with a role. Placements on aws run in dry-run mode until then.",
        )
    return ProviderCheck("aws", True, "", str(getattr(creds, "method", "") or "aws credential chain"))


def _check_azure() -> ProviderCheck:
    if not _has("azure.mgmt.compute"):
        return ProviderCheck(
            "azure", False, "azure-mgmt-compute is not installed. To fix: pip install 'hybrid-broker[azure]'."
        )
    sub = os.environ.get("AZURE_SUBSCRIPTION_ID")
    if all(os.environ.get(k) for k in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET")):
        source = "environment (client secret)"
    elif os.environ.get("AZURE_CLIENT_ID") and os.environ.get("AZURE_FEDERATED_TOKEN_FILE"):
        source = "environment (workload identity)"
    elif os.environ.get("IDENTITY_ENDPOINT") or os.environ.get("MSI_ENDPOINT"):
        # Container Apps, App Service, Functions, Arc: the platform's managed identity endpoint
        source = "managed identity" + (f" (client id {os.environ['AZURE_CLIENT_ID']})"
                                       if os.environ.get("AZURE_CLIENT_ID") else " (system-assigned)")
    elif os.environ.get("BROKER_AZURE_MANAGED_IDENTITY", "").lower() in ("1", "true", "yes"):
        source = "managed identity (VM/VMSS instance metadata service)"
    elif (Path.home() / ".azure" / "msal_token_cache.json").exists():
        source = "Azure CLI login (~/.azure)"
    else:
        return ProviderCheck(
            "azure",
            False,
            "no Azure credentials found. To fix: set AZURE_CLIENT_ID, AZURE_TENANT_ID, AZURE_CLIENT_SECRET "
            "and AZURE_SUBSCRIPTION_ID, run `az login`, or on an Azure VM with a managed identity set "
            "BROKER_AZURE_MANAGED_IDENTITY=true. Placements on azure run in dry-run mode until then.",
        )
    if not sub:
        return ProviderCheck(
            "azure", False, "AZURE_SUBSCRIPTION_ID is not set. To fix: export it.", source
        )
    return ProviderCheck("azure", True, "", source)


def _check_gcp() -> ProviderCheck:
    if not _has("libcloud"):
        return ProviderCheck(
            "gcp", False, "apache-libcloud is not installed. To fix: pip install 'hybrid-broker[server]'."
        )
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    project = os.environ.get("GOOGLE_CLOUD_PROJECT")
    if not path:
        adc = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud") / \
            "application_default_credentials.json"
        if adc.exists():
            path = str(adc)
        elif os.environ.get("GCE_METADATA_HOST") or os.environ.get("BROKER_GCP_METADATA", "").lower() in (
                "1", "true", "yes"):
            if not project:
                return ProviderCheck("gcp", False, "no project. To fix: set GOOGLE_CLOUD_PROJECT.",
                                     "metadata server")
            return ProviderCheck("gcp", True, "", f"metadata server (GCE/GKE workload identity, project {project})")
        else:
            return ProviderCheck(
                "gcp",
                False,
                "no GCP credentials found. To fix: set GOOGLE_APPLICATION_CREDENTIALS to a service-account key or "
                "a workload identity configuration, run `gcloud auth application-default login`, or on GCE/GKE set "
                "BROKER_GCP_METADATA=true; and set GOOGLE_CLOUD_PROJECT. Placements on gcp run in dry-run mode "
                "until then.",
            )
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return ProviderCheck(
            "gcp", False, f"cannot read {path}: {exc}. To fix: check GOOGLE_APPLICATION_CREDENTIALS."
        )
    kind = data.get("type") if isinstance(data, dict) else None
    if kind not in ("service_account", "authorized_user", "external_account", "impersonated_service_account"):
        return ProviderCheck(
            "gcp", False, f"{path} is not a service-account key nor an ADC file. To fix: create a key in IAM, or "
            "run `gcloud auth application-default login`, or write a workload identity configuration."
        )
    if kind == "service_account" and "client_email" not in data:
        return ProviderCheck(
            "gcp", False, f"{path} is not a service-account key. To fix: create one in IAM and download it."
        )
    project = project or data.get("project_id") or data.get("quota_project_id")
    if not project:
        return ProviderCheck(
            "gcp", False, "no project. To fix: set GOOGLE_CLOUD_PROJECT.", f"{kind} {path}"
        )
    who = f"service account {data['client_email']}" if kind == "service_account" else str(kind).replace("_", " ")
    return ProviderCheck("gcp", True, "", f"GOOGLE_APPLICATION_CREDENTIALS ({who}, project {project})")


def check() -> list[ProviderCheck]:
    """Whether each real provider is usable from here (credentials found; no network call), in order
    ``onprem, aws, azure, gcp``."""
    return [
        ProviderCheck("onprem", True, "", "inventory " + (os.environ.get("BROKER_INVENTORY") or "(localhost)")),
        _check_aws(),
        _check_azure(),
        _check_gcp(),
    ]
