"""Azure: ``azure-mgmt-compute`` for SKUs, VM sizes and VMs (create/get/delete as long-running operations)
and the public Azure Retail Prices API over httpx for prices.

* offers: ``resource_skus.list`` (``virtualMachines`` SKUs with capabilities ``vCPUs``, ``MemoryGB``,
  ``GPUs``, ``CpuArchitectureType``; SKUs restricted in the region are left out) intersected with
  ``virtual_machine_sizes.list``, priced by the Retail Prices API: ``$filter`` by ``serviceName eq 'Virtual
  Machines'``, ``armRegionName`` and ``priceType eq 'Consumption'``, paged through ``NextPageLink``; Windows
  rows (``productName`` ends in ``Windows``), ``Low Priority`` rows and dev/test rows are skipped; rows with
  ``Spot`` in ``skuName``/``meterName`` are spot prices.
* lifecycle: one VM per instance named ``hb-<hash of request id>-<n>`` (so a retried PUT is idempotent),
  tagged with the launch tags; instance ids are VM names within ``resource_group``.

Credentials: an explicit ``credential``, else ``ClientSecretCredential`` from ``AZURE_CLIENT_ID``/
``AZURE_TENANT_ID``/``AZURE_CLIENT_SECRET``, else ``DefaultAzureCredential``. SDK retries are off
(``retry_total=0``): :mod:`providers.failover` owns backoff, so every 429 is seen and recorded.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
from azure.core.exceptions import ResourceNotFoundError
from azure.mgmt.compute import ComputeManagementClient

from broker.errors import AuthError, ProviderError
from broker.model import Capacity, Instance, InstanceState, InstanceType, JobSpec, Location, Offer, Provenance

from .base import TAG_REQUEST, Capability, launch_tags, matches_tags, require_count
from .errors import map_errors

__all__ = ["AzureProvider", "parse_retail_prices", "DEFAULT_PRICES_URL", "accelerator_of"]

DEFAULT_PRICES_URL = "https://prices.azure.com/api/retail/prices"
PRICES_API_VERSION = "2023-01-01-preview"
DEFAULT_IMAGE = {"publisher": "Canonical", "offer": "0001-com-ubuntu-server-jammy", "sku": "22_04-lts-gen2",
                 "version": "latest"}
_CONTINENT = {"eastus": "na", "eastus2": "na", "westus": "na", "westus2": "na", "westus3": "na",
              "centralus": "na", "northeurope": "eu", "westeurope": "eu", "uksouth": "eu",
              "francecentral": "eu", "germanywestcentral": "eu", "swedencentral": "eu",
              "japaneast": "as", "southeastasia": "as", "australiaeast": "oc", "brazilsouth": "sa"}
_ACCEL = (("_A100", "A100"), ("_H100", "H100"), ("_T4", "T4"), ("_V100", "V100"), ("_A10", "A10"),
          ("NC6s_v3", "V100"), ("ND40rs_v2", "V100"), ("_M60", "M60"), ("_K80", "K80"))


def accelerator_of(sku: str) -> str | None:
    """The GPU model an Azure size name implies (``Standard_NC4as_T4_v3`` -> ``T4``), else ``None``."""
    for needle, model in _ACCEL:
        if needle.lower() in sku.lower():
            return model
    return None


def parse_retail_prices(items: Iterable[Mapping[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """(on-demand, spot) Linux USD/hour per ``armSkuName`` from Retail Prices ``Items`` rows."""
    ondemand: dict[str, float] = {}
    spot: dict[str, float] = {}
    for row in items:
        if row.get("serviceName") != "Virtual Machines" or row.get("type") != "Consumption":
            continue
        if str(row.get("productName", "")).endswith("Windows"):
            continue
        names = f"{row.get('skuName', '')} {row.get('meterName', '')}"
        if "Low Priority" in names or row.get("unitOfMeasure") != "1 Hour":
            continue
        sku = row.get("armSkuName")
        usd = row.get("retailPrice")
        if not sku or not isinstance(usd, int | float) or usd <= 0:
            continue
        target = spot if "Spot" in names else ondemand
        target[sku] = min(float(usd), target.get(sku, float(usd)))
    return ondemand, spot


def _restricts(restriction: Any, region: str) -> bool:
    """True when a SKU restriction applies to ``region`` (the model is a mapping: ``values`` is a method)."""
    try:
        values = restriction["values"] or []
    except (KeyError, TypeError):
        values = []
    info = getattr(restriction, "restriction_info", None)
    locations = list(getattr(info, "locations", None) or [])
    return region.lower() in [str(v).lower() for v in [*values, *locations]]


def _vm_state(vm: Any) -> InstanceState:
    props = getattr(vm, "properties", None)
    state = str(getattr(props, "provisioning_state", None) or getattr(vm, "provisioning_state", "") or "")
    return {
        "creating": InstanceState.PENDING,
        "updating": InstanceState.PENDING,
        "succeeded": InstanceState.RUNNING,
        "deleting": InstanceState.TERMINATED,
        "failed": InstanceState.FAILED,
    }.get(state.lower(), InstanceState.UNKNOWN)


class AzureProvider:
    """Azure VMs in ``regions`` of ``subscription_id``, in ``resource_group`` (see the module docstring).

    ``base_url`` and ``connection_verify`` (a CA bundle path) point the SDK at another ARM endpoint (tests,
    sovereign clouds); ``subnet_id`` is the subnet new VMs join (required by real Azure)."""

    name = "azure"
    capabilities = frozenset(
        {Capability.SPOT, Capability.GPUS, Capability.MULTI_NODE, Capability.TAGS, Capability.LIVE_PRICES}
    )

    def __init__(
        self,
        subscription_id: str | None = None,
        *,
        regions: Iterable[str] = ("eastus",),
        resource_group: str = "hybrid-broker",
        credential: Any = None,
        base_url: str | None = None,
        connection_verify: str | bool | None = None,
        prices_url: str = DEFAULT_PRICES_URL,
        subnet_id: str | None = None,
        image: Mapping[str, str] | None = None,
        admin_username: str = "hb",
        ssh_public_key: str | None = None,
    ) -> None:
        sub = subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")
        if not sub:
            raise AuthError(
                "azure: no subscription id. To fix: set AZURE_SUBSCRIPTION_ID or pass subscription_id.",
                provider="azure",
            )
        self.subscription_id = sub
        self.regions = list(regions)
        self.resource_group = resource_group
        self._credential = credential
        self.base_url = base_url
        self.connection_verify = connection_verify
        self.prices_url = prices_url
        self.subnet_id = subnet_id
        self.image = dict(image or DEFAULT_IMAGE)
        self.admin_username = admin_username
        self.ssh_public_key = ssh_public_key
        self._lock = threading.Lock()
        self._errors: list[ProviderError] = []
        self.last_provenance: list[Provenance] = []

    # -- clients ------------------------------------------------------------------------------------------

    def _cred(self) -> Any:
        if self._credential is None:
            from azure.identity import ClientSecretCredential, DefaultAzureCredential

            env = os.environ
            if all(env.get(k) for k in ("AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET")):
                self._credential = ClientSecretCredential(
                    env["AZURE_TENANT_ID"], env["AZURE_CLIENT_ID"], env["AZURE_CLIENT_SECRET"]
                )
            else:
                self._credential = DefaultAzureCredential()
        return self._credential

    @contextmanager
    def _client(self, region: str | None = None, request_id: str | None = None) -> Iterator[Any]:
        kwargs: dict[str, Any] = {"retry_total": 0}
        if self.base_url:
            kwargs["base_url"] = self.base_url
            kwargs["polling_interval"] = 0
        if self.connection_verify is not None:
            kwargs["connection_verify"] = self.connection_verify
        with map_errors(self.name, region, request_id):
            with ComputeManagementClient(self._cred(), self.subscription_id, **kwargs) as client:
                yield client

    # -- offers ---------------------------------------------------------------------------------------------

    def _retail_prices(self, region: str) -> list[dict[str, Any]]:
        flt = (
            f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and priceType eq 'Consumption'"
        )
        items: list[dict[str, Any]] = []
        url: str | None = self.prices_url
        params: dict[str, str] | None = {"api-version": PRICES_API_VERSION, "$filter": flt}
        verify: Any = self.connection_verify if self.connection_verify is not None else True
        with map_errors(self.name, region), httpx.Client(timeout=60.0, verify=verify) as http:
            pages = 0
            while url and pages < 10_000:
                resp = http.get(url, params=params)
                resp.raise_for_status()
                body = resp.json()
                page = body.get("Items") or []
                items.extend(page)
                url, params, pages = body.get("NextPageLink") or None, None, pages + 1
                if not page:
                    break
        return items

    def offers(self) -> list[Offer]:
        self.last_provenance = []
        out: list[Offer] = []
        for region in self.regions:
            out.extend(self._region_offers(region))
        return out

    def _region_offers(self, region: str) -> list[Offer]:
        ondemand, spot = parse_retail_prices(self._retail_prices(region))
        shapes: dict[str, InstanceType] = {}
        restricted = 0
        with self._client(region) as c:
            sizes = {s.name for s in c.virtual_machine_sizes.list(region)}
            for sku in c.resource_skus.list(filter=f"location eq '{region}'"):
                if sku.resource_type != "virtualMachines" or sku.name not in sizes:
                    continue
                if any(_restricts(r, region) for r in (sku.restrictions or [])):
                    restricted += 1
                    continue
                shapes[sku.name] = self._to_instance_type(sku)
        loc = Location("azure", region, None, continent=_CONTINENT.get(region, ""))
        offers = [Offer(shapes[n], loc, Capacity.ON_DEMAND, ondemand[n], "azure-retail-prices")
                  for n in sorted(shapes) if n in ondemand]
        offers += [Offer(shapes[n], loc, Capacity.SPOT, spot[n], "azure-retail-prices")
                   for n in sorted(shapes) if n in spot]
        self.last_provenance.append(
            Provenance(source=f"azure:{self.prices_url}", date=datetime.now(UTC).date().isoformat(),
                       rows=len(ondemand) + len(spot), offers=len(offers),
                       dropped=restricted + sum(1 for n in shapes if n not in ondemand), provider="azure")
        )
        return offers

    @staticmethod
    def _to_instance_type(sku: Any) -> InstanceType:
        caps = {c.name: c.value for c in (sku.capabilities or [])}
        gpus = int(float(caps.get("GPUs", 0) or 0))
        arch = "arm64" if str(caps.get("CpuArchitectureType", "x64")).lower() == "arm64" else "amd64"
        return InstanceType(
            name=sku.name,
            vcpus=float(caps.get("vCPUs", 0) or 0),
            memory_gib=float(caps.get("MemoryGB", 0) or 0),
            gpus=gpus,
            accelerator=accelerator_of(sku.name) if gpus else None,
            arch=arch,
        )

    # -- lifecycle --------------------------------------------------------------------------------------

    def _vm_body(self, offer: Offer, name: str, tags: Mapping[str, str]) -> dict[str, Any]:
        os_profile: dict[str, Any] = {"computerName": name, "adminUsername": self.admin_username}
        if self.ssh_public_key:
            os_profile["linuxConfiguration"] = {
                "disablePasswordAuthentication": True,
                "ssh": {"publicKeys": [{"path": f"/home/{self.admin_username}/.ssh/authorized_keys",
                                        "keyData": self.ssh_public_key}]},
            }
        props: dict[str, Any] = {
            "hardwareProfile": {"vmSize": offer.instance_type.name},
            "storageProfile": {
                "imageReference": self.image,
                "osDisk": {"createOption": "FromImage", "deleteOption": "Delete",
                           "managedDisk": {"storageAccountType": "StandardSSD_LRS"}},
            },
            "osProfile": os_profile,
        }
        if self.subnet_id:
            props["networkProfile"] = {
                "networkApiVersion": "2020-11-01",
                "networkInterfaceConfigurations": [{
                    "name": f"{name}-nic",
                    "properties": {"primary": True, "deleteOption": "Delete",
                                   "ipConfigurations": [{"name": "ipconfig1",
                                                         "properties": {"subnet": {"id": self.subnet_id}}}]},
                }],
            }
        if offer.capacity is Capacity.SPOT:
            props.update({"priority": "Spot", "evictionPolicy": "Delete", "billingProfile": {"maxPrice": -1}})
        body: dict[str, Any] = {"location": offer.region, "tags": dict(tags), "properties": props}
        if offer.location.zone:
            body["zones"] = [offer.location.zone]
        return body

    def _to_instance(self, vm: Any) -> Instance:
        props = getattr(vm, "properties", None)
        hw = getattr(props, "hardware_profile", None)
        zones = getattr(vm, "zones", None) or []
        return Instance(
            id=str(vm.name),
            provider="azure",
            region=str(vm.location),
            instance_type=str(getattr(hw, "vm_size", "") or ""),
            state=_vm_state(vm),
            zone=zones[0] if zones else None,
            tags=dict(vm.tags or {}),
            launched_at=getattr(props, "time_created", None),
        )

    def launch(
        self,
        offer: Offer,
        count: int,
        request_id: str,
        *,
        tags: Mapping[str, str],
        job: JobSpec | None = None,
    ) -> list[Instance]:
        require_count("azure", offer, count, request_id)
        all_tags = launch_tags(tags, request_id)
        digest = hashlib.sha256(request_id.encode()).hexdigest()[:10]
        names = [f"hb-{digest}-{n}" for n in range(count)]
        with self._client(offer.region, request_id) as c:
            have = {vm.name: vm for vm in c.virtual_machines.list(self.resource_group)
                    if (vm.tags or {}).get(TAG_REQUEST) == request_id}
            made = []
            for name in names:
                if name in have:
                    made.append(have[name])
                    continue
                poller = c.virtual_machines.begin_create_or_update(
                    self.resource_group, name, self._vm_body(offer, name, all_tags)
                )
                made.append(poller.result())
        return [self._to_instance(vm) for vm in made]

    def instances(self, tags: Mapping[str, str] | None = None) -> list[Instance]:
        with self._client() as c:
            vms = list(c.virtual_machines.list(self.resource_group))
        return [self._to_instance(vm) for vm in vms
                if TAG_REQUEST in (vm.tags or {}) and matches_tags(vm.tags or {}, tags)]

    def terminate(self, ids: Sequence[str], request_id: str) -> None:
        if not ids:
            return
        with self._client(None, request_id) as c:
            for name in ids:
                try:
                    c.virtual_machines.begin_delete(self.resource_group, name).result()
                except ResourceNotFoundError:
                    continue

    def poll_errors(self) -> list[ProviderError]:
        with self._lock:
            out, self._errors = self._errors, []
            return out
