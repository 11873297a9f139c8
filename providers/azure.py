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
``AZURE_TENANT_ID``/``AZURE_CLIENT_SECRET``, else a managed identity (``ManagedIdentityCredential``, user-assigned
when ``AZURE_CLIENT_ID`` is set) where the platform exposes one (``IDENTITY_ENDPOINT``/``MSI_ENDPOINT``) or
``BROKER_AZURE_MANAGED_IDENTITY=true`` says so (VMs), else ``DefaultAzureCredential``. SDK retries are off
(``retry_total=0``): :mod:`providers.failover` owns backoff, so every 429 is seen and recorded.
"""

from __future__ import annotations

import base64
import dataclasses
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

from .base import TAG_JOB, TAG_REQUEST, Capability, launch_tags, matches_tags, reclaimed_error, require_count
from .bootstrap import Report, parse_report, script_for
from .errors import map_errors
from .images import AZURE_IMAGES, pick

__all__ = ["AzureProvider", "parse_retail_prices", "DEFAULT_PRICES_URL", "accelerator_of", "power_state",
           "CUSTOM_DATA_MAX_BYTES", "VNET_PREFIX", "SUBNET_PREFIX", "GPU_DRIVER_EXTENSION",
           "GPU_DRIVER_EXTENSION_NAME", "GPU_DRIVERS"]

DEFAULT_PRICES_URL = "https://prices.azure.com/api/retail/prices"
PRICES_API_VERSION = "2023-01-01-preview"
CUSTOM_DATA_MAX_BYTES = 64 * 1024  # osProfile.customData: at most 65535 bytes before base64
VNET_PREFIX = "10.77.0.0/16"  # the adapter's own VNet per region when no subnet_id is configured
SUBNET_PREFIX = "10.77.0.0/20"
# The NVIDIA GPU Driver Extension for Linux (Microsoft Learn, "NVIDIA GPU Driver Extension for Linux"): installs
# the CUDA driver on N-series VMs of a supported Ubuntu/RHEL image after boot, and may reboot the VM to load it.
GPU_DRIVER_EXTENSION_NAME = "NvidiaGpuDriverLinux"
GPU_DRIVER_EXTENSION: dict[str, Any] = {"publisher": "Microsoft.HpcCompute", "type": "NvidiaGpuDriverLinux",
                                        "typeHandlerVersion": "1.6", "autoUpgradeMinorVersion": True,
                                        "settings": {}}
GPU_DRIVERS = ("extension", "image", "both")  # how a GPU VM gets its NVIDIA driver (the gpu_driver option)
GPU_DRIVER_WAIT_SECONDS = 1800  # how long a job's script waits for the extension's driver before giving up
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


def power_state(vm: Any) -> str:
    """``running`` / ``stopped`` / ``deallocated`` ... from a VM's instance view (``PowerState/<x>``), else ``""``."""
    props = getattr(vm, "properties", None)
    view = getattr(props, "instance_view", None) or getattr(vm, "instance_view", None)
    for status in getattr(view, "statuses", None) or []:
        code = str(getattr(status, "code", "") or "")
        if code.startswith("PowerState/"):
            return code.split("/", 1)[1].lower()
    return ""


def _ssh_public_key() -> str:
    """A fresh Ed25519 public key in OpenSSH form (Azure takes Ed25519 for Linux VMs), for VMs nobody logs
    in to: Azure requires a key or a password for the admin account; the private half is never kept (jobs
    report through the serial console)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                         serialization.PublicFormat.OpenSSH).decode() + " hybrid-broker"


class AzureProvider:
    """Azure VMs in ``regions`` of ``subscription_id``, in ``resource_group`` (see the module docstring).

    ``base_url`` and ``connection_verify`` (a CA bundle path) point the SDK at another ARM endpoint (tests,
    sovereign clouds). Networking: each VM gets its own NIC (deleted with the VM) in ``subnet_id`` (a subnet
    resource id, or ``{region: id}``); without one the adapter creates a VNet ``hb-vnet-<region>``
    (``10.77.0.0/16``) with subnet ``default`` in ``resource_group`` per region. The resource group itself
    is created (in the first region) when missing. The admin account takes ``ssh_public_key``, else a key
    made here whose private half is discarded.

    GPU VMs get their NVIDIA driver per ``gpu_driver``: ``extension`` (default) boots the CPU image of the
    arch (or ``images["amd64-gpu"]`` when given) and adds the NVIDIA GPU Driver Extension
    (:data:`GPU_DRIVER_EXTENSION`, one ``PUT .../virtualMachines/{vm}/extensions/NvidiaGpuDriverLinux``, not
    waited for); the job's script waits for ``nvidia-smi`` before it runs the command. ``image`` boots the
    Ubuntu-HPC image (driver built in, no extension); ``both`` does both."""

    name = "azure"
    capabilities = frozenset(
        {Capability.SPOT, Capability.GPUS, Capability.MULTI_NODE, Capability.TAGS, Capability.LIVE_PRICES,
         Capability.RUNS_WORK}
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
        subnet_id: str | Mapping[str, str] | None = None,
        image: Mapping[str, str] | None = None,
        admin_username: str = "hb",
        ssh_public_key: str | None = None,
        max_runtime_hours: float | None = None,
        images: Mapping[str, Mapping[str, str]] | None = None,
        gpu_driver: str = "extension",
    ) -> None:
        if gpu_driver not in GPU_DRIVERS:
            from broker.errors import InvalidRequestError

            raise InvalidRequestError(f"azure: gpu_driver {gpu_driver!r} is not one of {', '.join(GPU_DRIVERS)}. "
                                      "To fix: set BROKER_AZURE_GPU_DRIVER to extension, image or both.",
                                      provider="azure")
        self.gpu_driver = gpu_driver
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
        self.image = dict(image) if image else None  # one image for every VM; else by arch/GPU (images)
        self.images = dict(images or {})
        self.admin_username = admin_username
        self.ssh_public_key = ssh_public_key
        self.max_runtime_hours = max_runtime_hours
        self._group_ready = False
        self._subnets: dict[str, str] = {}
        self._reports: dict[str, Report] = {}  # VM name -> what its serial log reported
        self._ended: set[str] = set()  # VMs we deleted, or whose eviction was already reported
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
            elif (env.get("IDENTITY_ENDPOINT") or env.get("MSI_ENDPOINT")
                  or env.get("BROKER_AZURE_MANAGED_IDENTITY", "").lower() in ("1", "true", "yes")):
                from azure.identity import ManagedIdentityCredential

                # user-assigned when AZURE_CLIENT_ID names it (the terraform module's identity), else system
                self._credential = ManagedIdentityCredential(client_id=env.get("AZURE_CLIENT_ID") or None)
            else:
                self._credential = DefaultAzureCredential()
        return self._credential

    def _kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"retry_total": 0}
        if self.base_url:
            kwargs["base_url"] = self.base_url
            kwargs["polling_interval"] = 0
        if self.connection_verify is not None:
            kwargs["connection_verify"] = self.connection_verify
        return kwargs

    @contextmanager
    def _client(self, region: str | None = None, request_id: str | None = None) -> Iterator[Any]:
        with map_errors(self.name, region, request_id):
            with ComputeManagementClient(self._cred(), self.subscription_id, **self._kwargs()) as client:
                yield client

    @contextmanager
    def _network(self, region: str | None = None, request_id: str | None = None) -> Iterator[Any]:
        from azure.mgmt.network import NetworkManagementClient

        with map_errors(self.name, region, request_id):
            with NetworkManagementClient(self._cred(), self.subscription_id, **self._kwargs()) as client:
                yield client

    def _ensure_group(self, request_id: str | None = None) -> None:
        """Create ``resource_group`` (in the first region) when missing; once per adapter."""
        if self._group_ready:
            return
        from azure.mgmt.resource.resources import ResourceManagementClient

        with map_errors(self.name, self.regions[0], request_id):
            with ResourceManagementClient(self._cred(), self.subscription_id, **self._kwargs()) as rm:
                if not rm.resource_groups.check_existence(self.resource_group):
                    rm.resource_groups.create_or_update(
                        self.resource_group, {"location": self.regions[0], "tags": {"hb-managed": "true"}})
        self._group_ready = True

    def _subnet(self, region: str, request_id: str | None = None) -> str:
        """The subnet id VMs in ``region`` join: configured, else the adapter's own VNet (created once)."""
        if isinstance(self.subnet_id, str):
            return self.subnet_id
        if isinstance(self.subnet_id, Mapping) and region in self.subnet_id:
            return str(self.subnet_id[region])
        if region in self._subnets:
            return self._subnets[region]
        vnet = f"hb-vnet-{region}"
        body = {"location": region, "tags": {"hb-managed": "true"},
                "properties": {"addressSpace": {"addressPrefixes": [VNET_PREFIX]},
                               "subnets": [{"name": "default", "properties": {"addressPrefix": SUBNET_PREFIX}}]}}
        with self._network(region, request_id) as net:
            try:
                net.virtual_networks.get(self.resource_group, vnet)
            except ResourceNotFoundError:
                net.virtual_networks.begin_create_or_update(self.resource_group, vnet, body).result()
        sid = (f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}/providers/"
               f"Microsoft.Network/virtualNetworks/{vnet}/subnets/default")
        self._subnets[region] = sid
        return sid

    def _nic(self, region: str, name: str, tags: Mapping[str, str], request_id: str) -> str:
        """Create (or find) the VM's NIC ``<name>-nic`` and return its id."""
        body = {"location": region, "tags": dict(tags),
                "properties": {"ipConfigurations": [{"name": "ipconfig1", "properties": {
                    "privateIPAllocationMethod": "Dynamic", "subnet": {"id": self._subnet(region, request_id)}}}]}}
        with self._network(region, request_id) as net:
            nic = net.network_interfaces.begin_create_or_update(self.resource_group, f"{name}-nic", body).result()
        return str(nic.id)

    def _delete_nics(self, names: Sequence[str], request_id: str | None = None) -> None:
        with self._network(None, request_id) as net:
            for name in names:
                try:
                    net.network_interfaces.begin_delete(self.resource_group, name).result()
                except ResourceNotFoundError:
                    continue

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

    def _vm_body(self, offer: Offer, name: str, tags: Mapping[str, str], nic_id: str,
                 job: JobSpec | None = None) -> dict[str, Any]:
        """The VM PUT body: size, image, OS disk and NIC deleted with the VM, an admin account with an SSH key,
        boot diagnostics on (managed storage: the serial log is how the job reports), the job's start-up
        script as cloud-init custom data, and spot settings (``Deallocate`` on eviction, so the broker sees
        the eviction and deletes the VM)."""
        key = self.ssh_public_key or self._generated_key()
        os_profile: dict[str, Any] = {
            "computerName": name, "adminUsername": self.admin_username,
            "linuxConfiguration": {
                "disablePasswordAuthentication": True,
                "ssh": {"publicKeys": [{"path": f"/home/{self.admin_username}/.ssh/authorized_keys",
                                        "keyData": key}]},
            },
        }
        if job is not None and job.command:
            script = script_for(job, "azure", max_bytes=CUSTOM_DATA_MAX_BYTES, spot=offer.capacity is Capacity.SPOT,
                                max_runtime_hours=self.max_runtime_hours,
                                wait_gpu_driver_seconds=GPU_DRIVER_WAIT_SECONDS if self._driver_extension(offer)
                                else None)
            os_profile["customData"] = base64.b64encode(script.encode()).decode()
        props: dict[str, Any] = {
            "hardwareProfile": {"vmSize": offer.instance_type.name},
            "storageProfile": {
                "imageReference": self.image or self._image(offer),
                "osDisk": {"createOption": "FromImage", "deleteOption": "Delete",
                           "managedDisk": {"storageAccountType": "StandardSSD_LRS"}},
            },
            "osProfile": os_profile,
            "networkProfile": {"networkInterfaces": [
                {"id": nic_id, "properties": {"primary": True, "deleteOption": "Delete"}}]},
            "diagnosticsProfile": {"bootDiagnostics": {"enabled": True}},
        }
        if offer.capacity is Capacity.SPOT:
            props.update({"priority": "Spot", "evictionPolicy": "Deallocate", "billingProfile": {"maxPrice": -1}})
        body: dict[str, Any] = {"location": offer.region, "tags": dict(tags), "properties": props}
        if offer.location.zone:
            body["zones"] = [offer.location.zone]
        return body

    def _driver_extension(self, offer: Offer) -> bool:
        """Whether a VM of ``offer`` gets the NVIDIA GPU Driver Extension (a GPU type, ``gpu_driver`` not
        ``image``)."""
        return bool(offer.instance_type.gpus) and self.gpu_driver in ("extension", "both")

    def _image(self, offer: Offer) -> dict[str, str]:
        """The image reference of ``offer``'s VM (see the class docstring for GPU types)."""
        shape = offer.instance_type
        if shape.gpus and self.gpu_driver == "extension" and "amd64-gpu" not in self.images and shape.arch != "arm64":
            shape = dataclasses.replace(shape, gpus=0)  # the extension brings the driver: the plain image
        return dict(pick("azure", shape, AZURE_IMAGES, self.images, region=offer.region))

    def _add_driver_extension(self, region: str, name: str, tags: Mapping[str, str], request_id: str) -> None:
        """``PUT`` the NVIDIA GPU Driver Extension on VM ``name`` (idempotent; the install is not waited for:
        the job's script waits for the driver, and a VM deleted meanwhile takes its extensions with it)."""
        body = {"location": region, "tags": dict(tags), "properties": dict(GPU_DRIVER_EXTENSION)}
        with self._client(region, request_id) as c:
            c.virtual_machine_extensions.begin_create_or_update(
                self.resource_group, name, GPU_DRIVER_EXTENSION_NAME, body, polling=False)

    def _generated_key(self) -> str:
        with self._lock:
            if not self.ssh_public_key:
                self.ssh_public_key = _ssh_public_key()
            return self.ssh_public_key

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
        self._ensure_group(request_id)
        with self._client(offer.region, request_id) as c:
            have = {vm.name: vm for vm in c.virtual_machines.list(self.resource_group)
                    if (vm.tags or {}).get(TAG_REQUEST) == request_id}
        made = []
        for name in names:
            if name in have:
                made.append(have[name])
                if self._driver_extension(offer):  # a retried launch: the PUT is idempotent
                    self._add_driver_extension(offer.region, name, all_tags, request_id)
                continue
            nic_id = self._nic(offer.region, name, all_tags, request_id)
            try:
                with self._client(offer.region, request_id) as c:
                    poller = c.virtual_machines.begin_create_or_update(
                        self.resource_group, name, self._vm_body(offer, name, all_tags, nic_id, job))
                    made.append(poller.result())
                if self._driver_extension(offer):
                    self._add_driver_extension(offer.region, name, all_tags, request_id)
            except ProviderError:
                # a VM that failed to be created leaves its NIC behind: delete it (the VM, if any, is
                # found by tag and deleted by the failover cleanup)
                try:
                    with self._client(offer.region, request_id) as c:
                        c.virtual_machines.get(self.resource_group, name)
                except ProviderError:
                    self._delete_nics([f"{name}-nic"], request_id)
                raise
        return [self._to_instance(vm) for vm in made]

    def instances(self, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """Our VMs matching ``tags``, listed with their instance view (one call). A VM that stopped without us
        deleting it is ``succeeded``/``failed`` with the exit code and log tail its serial log shows (boot
        diagnostics: ``retrieveBootDiagnosticsData`` then the log blob, once per VM); a spot VM deallocated
        without that report was evicted: a ``CapacityError`` for it is queued for :meth:`poll_errors`."""
        with self._client() as c:
            vms = list(c.virtual_machines.list(self.resource_group, expand="instanceView"))
        out: list[Instance] = []
        for vm in vms:
            if TAG_REQUEST not in (vm.tags or {}) or not matches_tags(vm.tags or {}, tags):
                continue
            inst = self._to_instance(vm)
            power = power_state(vm)
            if inst.state is InstanceState.RUNNING and power in ("stopping", "deallocating"):
                pass  # still ending: the serial log may not hold the report yet
            elif inst.state is InstanceState.RUNNING and power in ("stopped", "deallocated"):
                report = self._report(inst)
                props = getattr(vm, "properties", None)
                priority = getattr(props, "priority", None) or getattr(vm, "priority", None)
                spot = str(getattr(priority, "value", priority) or "").lower() == "spot"
                if report.exit_code is not None and not report.preempted:
                    inst = dataclasses.replace(
                        inst, state=InstanceState.SUCCEEDED if report.exit_code == 0 else InstanceState.FAILED,
                        exit_code=report.exit_code, log_tail=report.log_tail)
                else:
                    inst = dataclasses.replace(inst, state=InstanceState.TERMINATED)
                    if spot or report.preempted:
                        self._evicted(inst)
            out.append(inst)
        return out

    def _report(self, inst: Instance) -> Report:
        with self._lock:
            if inst.id in self._reports:
                return self._reports[inst.id]
            if inst.id in self._ended:
                return Report(None)
        with self._client(inst.region) as c:
            data = c.virtual_machines.retrieve_boot_diagnostics_data(self.resource_group, inst.id,
                                                                     sas_uri_expiration_time_in_minutes=5)
        uri = getattr(data, "serial_console_log_blob_uri", None)
        text = ""
        if uri:
            verify: Any = self.connection_verify if self.connection_verify is not None else True
            with map_errors(self.name, inst.region):
                resp = httpx.get(str(uri), timeout=60.0, verify=verify)
                resp.raise_for_status()
                text = resp.text
        report = parse_report(text)
        with self._lock:
            self._reports[inst.id] = report
        return report

    def _evicted(self, inst: Instance) -> None:
        with self._lock:
            if inst.id not in self._ended:  # reported once
                self._ended.add(inst.id)
                self._errors.append(reclaimed_error(inst, "was evicted", "evicted"))

    def terminate(self, ids: Sequence[str], request_id: str) -> None:
        """Delete VMs by name (their OS disk and NIC go with them: ``deleteOption Delete``), then any NIC of
        theirs left behind; unknown names are ignored."""
        if not ids:
            return
        with self._client(None, request_id) as c:
            for name in ids:
                with self._lock:
                    self._ended.add(name)
                try:
                    c.virtual_machines.begin_delete(self.resource_group, name).result()
                except ResourceNotFoundError:
                    continue
        self._delete_nics([f"{name}-nic" for name in ids], request_id)

    def orphans(self, active_jobs: set[str]) -> list[Any]:
        """NICs tagged ``hb-request`` attached to no VM, and unattached OS disks of ``hb-`` VMs that are gone,
        whose job is not active."""
        from .sweeper import Orphan

        with self._client() as c:
            vm_names = {str(vm.name).lower() for vm in c.virtual_machines.list(self.resource_group)}
            disks = list(c.disks.list_by_resource_group(self.resource_group))
        with self._network() as net:
            nics = list(net.network_interfaces.list(self.resource_group))
        out = []
        for nic in nics:
            tags = dict(nic.tags or {})
            props = getattr(nic, "properties", None)
            attached = getattr(props, "virtual_machine", None) or getattr(nic, "virtual_machine", None)
            if TAG_REQUEST in tags and not attached and tags.get(TAG_JOB) not in active_jobs:
                out.append(Orphan("azure", "nic", str(nic.name), tags.get(TAG_JOB, ""), tags[TAG_REQUEST]))
        for disk in disks:
            name = str(disk.name)
            owner = getattr(disk, "managed_by", None) or getattr(getattr(disk, "properties", None), "managed_by", None)
            vm = name.split("_OsDisk")[0]
            if name.startswith("hb-") and "_OsDisk" in name and not owner and vm.lower() not in vm_names:
                out.append(Orphan("azure", "disk", name))
        return out

    def delete_orphans(self, items: Sequence[Any]) -> None:
        self._delete_nics([o.id for o in items if o.kind == "nic"], "sweeper")
        with self._client(None, "sweeper") as c:
            for o in items:
                if o.kind == "disk":
                    try:
                        c.disks.begin_delete(self.resource_group, o.id).result()
                    except ResourceNotFoundError:
                        continue

    def poll_errors(self) -> list[ProviderError]:
        with self._lock:
            out, self._errors = self._errors, []
            return out
