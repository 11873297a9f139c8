"""A local fake of Azure Resource Manager (resource groups, compute, network) and the Azure Retail Prices API,
in their documented wire formats (RECIPES §3), served by uvicorn over TLS in a thread. Only what the adapter
calls, and strict where ARM is: a VM PUT is refused, with ARM's error codes, without an existing resource
group, a known size, an image, an OS profile with an admin user and an SSH key (or password), valid
base64 custom data, or an existing, unattached NIC in the VM's region (REST API reference,
Microsoft.Compute/virtualMachines and Microsoft.Network/networkInterfaces). A VM extension PUT
(``.../virtualMachines/{vm}/extensions/{name}``, REST reference "Virtual Machine Extensions - Create Or
Update") is refused without a published Microsoft.Compute ``api-version``, for a VM that does not exist, without
``properties.publisher``/``type``/``typeHandlerVersion`` (strings) or with ``settings`` that is not an object,
and for an extension the repository does not hold (:data:`EXTENSIONS`); extensions go with their VM. The NVIDIA
GPU Driver Extension on a GPU size installs the guest's driver (its ``nvidia-smi`` starts to work); on another
size it ends ``Failed``, as the real one does. A VM's custom data runs in a
:class:`tests.providers.guest.Guest` once it is provisioned; its serial output is the boot diagnostics log."""

from __future__ import annotations

import asyncio
import base64
import binascii
import threading
import time
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from .guest import Guest

CUSTOM_DATA_MAX_CHARS = 87380  # base64 of 65535 bytes

# Microsoft.Compute API versions published for virtualMachines/extensions (the azure-rest-api-specs folders),
# up to the one azure-mgmt-compute 39 sends (2026-04-01).
COMPUTE_API_VERSIONS = frozenset({
    "2015-06-15", "2016-03-30", "2016-04-30-preview", "2017-03-30", "2017-12-01", "2018-04-01", "2018-06-01",
    "2018-10-01", "2019-03-01", "2019-07-01", "2019-12-01", "2020-06-01", "2020-12-01", "2021-03-01",
    "2021-04-01", "2021-07-01", "2021-11-01", "2022-03-01", "2022-08-01", "2022-11-01", "2023-03-01",
    "2023-07-01", "2023-09-01", "2024-03-01", "2024-07-01", "2024-11-01", "2025-04-01", "2026-04-01"})
# (publisher, type) -> type handler versions the extension repository holds (Microsoft Learn pages of each).
EXTENSIONS = {
    ("Microsoft.HpcCompute", "NvidiaGpuDriverLinux"): {"1.2", "1.3", "1.4", "1.5", "1.6", "1.9"},
    ("Microsoft.HpcCompute", "InfiniBandDriverLinux"): {"1.2"},
    ("Microsoft.Azure.Extensions", "CustomScript"): {"2.0", "2.1"},
}
REGIONS = {"eastus": 1.0, "westeurope": 1.1}
SKUS = [  # name, vCPUs, MemoryGB, GPUs, restricted in
    ("Standard_D2s_v5", 2, 8, 0, ()),
    ("Standard_D4s_v5", 4, 16, 0, ()),
    ("Standard_NC4as_T4_v3", 4, 28, 1, ()),
    ("Standard_E2s_v5", 2, 16, 0, ("eastus",)),
]
LINUX_USD = {"Standard_D2s_v5": 0.096, "Standard_D4s_v5": 0.192, "Standard_NC4as_T4_v3": 0.526,
             "Standard_E2s_v5": 0.126}


def _sku(name: str, vcpus: int, mem: int, gpus: int, restricted: tuple[str, ...]) -> dict[str, Any]:
    caps = [{"name": "vCPUs", "value": str(vcpus)}, {"name": "MemoryGB", "value": str(mem)},
            {"name": "CpuArchitectureType", "value": "x64"}]
    if gpus:
        caps.append({"name": "GPUs", "value": str(gpus)})
    return {
        "resourceType": "virtualMachines", "name": name, "tier": "Standard", "size": name.split("_", 1)[1],
        "family": "standardDSv5Family", "locations": list(REGIONS),
        "locationInfo": [{"location": r, "zones": ["1", "2", "3"]} for r in REGIONS],
        "capabilities": caps,
        "restrictions": [{"type": "Location", "values": [r], "reasonCode": "NotAvailableForSubscription",
                          "restrictionInfo": {"locations": [r]}} for r in restricted],
    }


def price_rows(region: str) -> list[dict[str, Any]]:
    mult = REGIONS[region]
    rows = []
    for sku, usd in LINUX_USD.items():
        short = sku.removeprefix("Standard_").replace("_", " ")
        base = {"currencyCode": "USD", "tierMinimumUnits": 0.0, "armRegionName": region, "location": region,
                "effectiveStartDate": "2026-10-01T00:00:00Z", "serviceName": "Virtual Machines",
                "serviceId": "DZH313Z7MMC8", "serviceFamily": "Compute", "unitOfMeasure": "1 Hour",
                "isPrimaryMeterRegion": True, "armSkuName": sku, "productId": "DZH318Z0", "meterId": uuid.uuid4().hex}
        series = f"Virtual Machines {short.split()[0][:2]} Series"
        for suffix, product, kind, factor in (
            ("", series, "Consumption", 1.0),
            (" Spot", series, "Consumption", 0.2),
            (" Low Priority", series, "Consumption", 0.2),
            ("", series + " Windows", "Consumption", 1.96),
            ("", series, "DevTestConsumption", 0.9),
        ):
            price = round(usd * mult * factor, 6)
            rows.append(base | {"retailPrice": price, "unitPrice": price, "meterName": short + suffix,
                                "skuName": short + suffix, "productName": product, "type": kind,
                                "skuId": f"DZH318Z0/{len(rows):04d}"})
    return rows


def make_app(page_size: int = 4) -> FastAPI:
    app = FastAPI()
    vms: dict[tuple[str, str, str], dict[str, Any]] = {}
    ops: dict[str, int] = {}
    app.state.vms = vms
    serial = asyncio.Lock()

    @app.middleware("http")
    async def one_request_at_a_time(request: Request, call_next: Any) -> Any:
        """Each request applies atomically to the fake's state (the broker may launch several VMs at once;
        ARM is consistent per request, and the fake's dicts must not change under a listing)."""
        async with serial:
            return await call_next(request)

    @app.get("/subscriptions/{sub}/providers/Microsoft.Compute/skus")
    def skus(sub: str, request: Request) -> dict[str, Any]:
        flt = request.query_params.get("$filter", "")
        want = flt.split("'")[1] if "'" in flt else None
        out = [_sku(*s) for s in SKUS]
        if want:
            for s in out:
                s["locations"] = [want]
                s["locationInfo"] = [i for i in s["locationInfo"] if i["location"] == want]
                s["restrictions"] = [r for r in s["restrictions"] if want in r["values"]]
        return {"value": out}

    @app.get("/subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/vmSizes")
    def vm_sizes(sub: str, loc: str) -> dict[str, Any]:
        return {"value": [{"name": n, "numberOfCores": c, "memoryInMB": m * 1024, "osDiskSizeInMB": 1047552,
                           "resourceDiskSizeInMB": 0, "maxDataDiskCount": 8} for n, c, m, _, _ in SKUS]}

    groups: dict[tuple[str, str], dict[str, Any]] = {}
    vnets: dict[tuple[str, str, str], dict[str, Any]] = {}
    nics: dict[tuple[str, str, str], dict[str, Any]] = {}
    disks: dict[tuple[str, str, str], dict[str, Any]] = {}
    guests: dict[tuple[str, str, str], Guest] = {}
    app.state.groups, app.state.vnets, app.state.nics, app.state.disks = groups, vnets, nics, disks
    app.state.guests = guests

    def err(status: int, code: str, message: str, target: str | None = None) -> JSONResponse:
        body: dict[str, Any] = {"code": code, "message": message}
        if target:
            body["target"] = target
        return JSONResponse({"error": body}, status_code=status)

    # -- resource groups (Microsoft.Resources; the SDK spells the path "resourcegroups")
    for rg_path in ("/subscriptions/{sub}/resourcegroups/{rg}", "/subscriptions/{sub}/resourceGroups/{rg}"):
        @app.head(rg_path)
        def head_group(sub: str, rg: str) -> Response:
            return Response(status_code=204 if (sub, rg.lower()) in groups else 404)

        @app.put(rg_path)
        async def put_group(sub: str, rg: str, request: Request) -> Response:
            body = await request.json()
            if not body.get("location"):
                return err(400, "LocationRequired", "The location property is required for this definition.")
            existed = (sub, rg.lower()) in groups
            groups[(sub, rg.lower())] = {"id": f"/subscriptions/{sub}/resourceGroups/{rg}", "name": rg,
                                         "type": "Microsoft.Resources/resourceGroups", "location": body["location"],
                                         "tags": body.get("tags") or {},
                                         "properties": {"provisioningState": "Succeeded"}}
            return JSONResponse(groups[(sub, rg.lower())], status_code=200 if existed else 201)

        @app.get(rg_path)
        def get_group(sub: str, rg: str) -> Response:
            g = groups.get((sub, rg.lower()))
            if g is None:
                return err(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
            return JSONResponse(g)

    def no_group(sub: str, rg: str) -> JSONResponse | None:
        if (sub, rg.lower()) not in groups:
            return err(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
        return None

    net = "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network"

    @app.put(net + "/virtualNetworks/{name}")
    async def put_vnet(sub: str, rg: str, name: str, request: Request) -> Response:
        if (missing := no_group(sub, rg)) is not None:
            return missing
        body = await request.json()
        vid = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/virtualNetworks/{name}"
        props = body.get("properties") or {}
        if not (props.get("addressSpace") or {}).get("addressPrefixes"):
            return err(400, "InvalidRequestFormat", "addressSpace.addressPrefixes is required", "addressSpace")
        subnets = [{"id": f"{vid}/subnets/{sn['name']}", "name": sn["name"],
                    "properties": dict(sn.get("properties") or {}) | {"provisioningState": "Succeeded"}}
                   for sn in props.get("subnets") or []]
        doc = {"id": vid, "name": name, "type": "Microsoft.Network/virtualNetworks", "location": body.get("location"),
               "tags": body.get("tags") or {}, "properties": dict(props) | {"subnets": subnets,
                                                                           "provisioningState": "Succeeded"}}
        existed = (sub, rg.lower(), name.lower()) in vnets
        vnets[(sub, rg.lower(), name.lower())] = doc
        return JSONResponse(doc, status_code=200 if existed else 201)

    @app.get(net + "/virtualNetworks/{name}")
    def get_vnet(sub: str, rg: str, name: str) -> Response:
        doc = vnets.get((sub, rg.lower(), name.lower()))
        if doc is None:
            return err(404, "ResourceNotFound", f"The Resource 'Microsoft.Network/virtualNetworks/{name}' under "
                       f"resource group '{rg}' was not found.")
        return JSONResponse(doc)

    def subnet_of(subnet_id: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        parts = subnet_id.split("/")
        try:
            sub, rg, vnet, sn = parts[2], parts[4], parts[8], parts[10]
        except IndexError:
            return None
        doc = vnets.get((sub, rg.lower(), vnet.lower()))
        for s in (doc or {}).get("properties", {}).get("subnets", []):
            if s["name"].lower() == sn.lower():
                return doc, s  # type: ignore[return-value]
        return None

    @app.put(net + "/networkInterfaces/{name}")
    async def put_nic(sub: str, rg: str, name: str, request: Request) -> Response:
        if (missing := no_group(sub, rg)) is not None:
            return missing
        body = await request.json()
        configs = (body.get("properties") or {}).get("ipConfigurations") or []
        if not configs:
            return err(400, "InvalidRequestFormat", "A network interface needs at least one IP configuration.",
                       "ipConfigurations")
        for cfg in configs:
            sid = str(((cfg.get("properties") or {}).get("subnet") or {}).get("id") or "")
            found = subnet_of(sid)
            if found is None:
                return err(400, "InvalidResourceReference", f"Resource {sid} referenced by resource "
                           f"networkInterfaces/{name} was not found.")
            if found[0]["location"] != body.get("location"):
                return err(400, "InvalidResourceReference", f"Subnet {sid} is in {found[0]['location']}, not in "
                           f"{body.get('location')}.")
        nid = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/networkInterfaces/{name}"
        old = nics.get((sub, rg.lower(), name.lower()))
        doc = {"id": nid, "name": name, "type": "Microsoft.Network/networkInterfaces",
               "location": body.get("location"), "tags": body.get("tags") or {},
               "properties": {"ipConfigurations": configs, "provisioningState": "Succeeded",
                              "virtualMachine": (old or {}).get("properties", {}).get("virtualMachine")}}
        nics[(sub, rg.lower(), name.lower())] = doc
        return JSONResponse(doc, status_code=200 if old else 201)

    @app.get(net + "/networkInterfaces/{name}")
    def get_nic(sub: str, rg: str, name: str) -> Response:
        doc = nics.get((sub, rg.lower(), name.lower()))
        if doc is None:
            return err(404, "ResourceNotFound", f"The Resource 'Microsoft.Network/networkInterfaces/{name}' under "
                       f"resource group '{rg}' was not found.")
        return JSONResponse(doc)

    @app.get(net + "/networkInterfaces")
    def list_nics(sub: str, rg: str) -> dict[str, Any]:
        return {"value": [d for (s, g, _), d in nics.items() if s == sub and g == rg.lower()]}

    @app.delete(net + "/networkInterfaces/{name}")
    def delete_nic(sub: str, rg: str, name: str) -> Response:
        doc = nics.get((sub, rg.lower(), name.lower()))
        if doc is None:
            return Response(status_code=204)
        if doc["properties"].get("virtualMachine"):
            return err(400, "NicInUse", f"Network Interface {doc['id']} is used by existing resource "
                       f"{doc['properties']['virtualMachine']['id']}. In order to delete the network interface, "
                       "it must be dissociated from the resource.")
        del nics[(sub, rg.lower(), name.lower())]
        return Response(status_code=200)

    comp = "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute"

    def invalid_vm(sub: str, rg: str, name: str, body: dict[str, Any]) -> JSONResponse | None:
        """What ARM refuses in a VM PUT body (see the module docstring)."""
        if (missing := no_group(sub, rg)) is not None:
            return missing
        region = body.get("location")
        if not region:
            return err(400, "LocationRequired", "The location property is required for this definition.")
        props = body.get("properties") or {}
        size = (props.get("hardwareProfile") or {}).get("vmSize")
        if size not in {s[0] for s in SKUS}:
            return err(400, "InvalidParameter", f"The value {size} provided for the VM size is not valid.",
                       "vmSize")
        storage = props.get("storageProfile") or {}
        if not storage.get("imageReference"):
            return err(400, "InvalidParameter", "Required parameter 'imageReference' is missing (null).",
                       "imageReference")
        osp = props.get("osProfile")
        if not osp:
            return err(400, "InvalidParameter", "Required parameter 'osProfile' is missing (null).", "osProfile")
        if not osp.get("computerName"):
            return err(400, "InvalidParameter", "Required parameter 'computerName' is missing (null).",
                       "computerName")
        if not osp.get("adminUsername"):
            return err(400, "InvalidParameter", "Required parameter 'adminUsername' is missing (null).",
                       "adminUsername")
        linux = osp.get("linuxConfiguration") or {}
        keys = ((linux.get("ssh") or {}).get("publicKeys")) or []
        if linux.get("disablePasswordAuthentication"):
            if not keys or not all(str(k.get("keyData", "")).startswith(("ssh-rsa ", "ssh-ed25519 ")) for k in keys):
                return err(400, "InvalidParameter", "The SSH public key is missing or not in a supported format.",
                           "linuxConfiguration.ssh.publicKeys.keyData")
        elif not osp.get("adminPassword"):
            return err(400, "InvalidParameter", "Required parameter 'adminPassword' is missing (null).",
                       "adminPassword")
        if "customData" in osp:
            data = str(osp["customData"])
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                return err(400, "InvalidParameter", "Custom data is not a valid Base64 string.", "customData")
            if len(data) > CUSTOM_DATA_MAX_CHARS:
                return err(400, "InvalidParameter", f"Custom data is longer than {CUSTOM_DATA_MAX_CHARS} "
                           "characters.", "customData")
        refs = (props.get("networkProfile") or {}).get("networkInterfaces") or []
        if not refs:
            return err(400, "InvalidParameter", "Required parameter 'networkProfile' is missing (null).",
                       "networkProfile")
        vm_id = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}"
        for ref in refs:
            nid = str(ref.get("id") or "")
            parts = nid.split("/")
            nic = nics.get((parts[2], parts[4].lower(), parts[-1].lower())) if len(parts) == 9 else None
            if nic is None:
                return err(400, "InvalidResourceReference", f"Resource {nid} referenced by resource {vm_id} was "
                           "not found.")
            if nic["location"] != region:
                return err(400, "NicLocationDoesNotMatchVMLocation", f"NIC {nid} is in {nic['location']}, the VM "
                           f"in {region}.")
            owner = (nic["properties"].get("virtualMachine") or {}).get("id")
            if owner and owner.lower() != vm_id.lower():
                return err(400, "NicInUse", f"Network Interface {nid} is used by existing resource {owner}.")
        if props.get("priority") == "Spot" and props.get("evictionPolicy") not in ("Deallocate", "Delete"):
            return err(400, "InvalidParameter", "evictionPolicy must be Deallocate or Delete for Spot VMs.",
                       "evictionPolicy")
        return None

    def view(vm: dict[str, Any]) -> dict[str, Any]:
        return {"statuses": [
            {"code": f"ProvisioningState/{vm['properties']['provisioningState'].lower()}", "level": "Info"},
            {"code": f"PowerState/{vm['hb_power']}", "level": "Info"}]}

    def public(vm: dict[str, Any], expand: bool = False) -> dict[str, Any]:
        out = {k: v for k, v in vm.items() if not k.startswith("hb_")}
        if expand:
            out = out | {"properties": dict(out["properties"]) | {"instanceView": view(vm)}}
        return out

    @app.put(comp + "/virtualMachines/{name}")
    async def put_vm(sub: str, rg: str, name: str, request: Request) -> Response:
        body = await request.json()
        refused = invalid_vm(sub, rg, name, body)
        if refused is not None:
            return refused
        region = body["location"]
        props = body.get("properties", {})
        vm_id = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}"
        key = (sub, rg.lower(), name.lower())
        existed = key in vms
        disk_name = f"{name}_OsDisk_1_{uuid.uuid4().hex[:8]}"
        if existed:
            disk_name = vms[key]["properties"]["storageProfile"]["osDisk"]["name"]
        disk_id = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/disks/{disk_name}"
        os_disk = props.setdefault("storageProfile", {}).setdefault("osDisk", {})
        os_disk.update({"name": disk_name, "managedDisk": dict(os_disk.get("managedDisk") or {}) | {"id": disk_id}})
        disks[(sub, rg.lower(), disk_name.lower())] = {"id": disk_id, "name": disk_name, "location": region,
                                                       "managedBy": vm_id, "tags": {}}
        for ref in props["networkProfile"]["networkInterfaces"]:
            parts = ref["id"].split("/")
            nics[(parts[2], parts[4].lower(), parts[-1].lower())]["properties"]["virtualMachine"] = {"id": vm_id}
        custom = (props.get("osProfile") or {}).pop("customData", None)  # ARM never returns customData
        props["provisioningState"] = "Creating"
        props["vmId"] = str(uuid.uuid4())
        vm = {"id": vm_id, "name": name, "type": "Microsoft.Compute/virtualMachines", "location": region,
              "tags": body.get("tags", {}), "properties": props, "hb_power": "starting",
              "hb_custom_data": base64.b64decode(custom).decode("utf-8", "replace") if custom else None}
        if body.get("zones"):
            vm["zones"] = body["zones"]
        vms[key] = vm
        op = uuid.uuid4().hex
        ops[op] = 1
        base = str(request.base_url).rstrip("/")
        return JSONResponse(public(vm), status_code=200 if existed else 201, headers={
            "Azure-AsyncOperation": f"{base}/subscriptions/{sub}/providers/Microsoft.Compute/locations/"
                                    f"{region}/operations/{op}?api-version=2024-07-01",
            "Retry-After": "0"})

    def boot(key: tuple[str, str, str], vm: dict[str, Any]) -> None:
        vm["hb_power"] = "running"

        def powered_off() -> None:
            if vms.get(key) is vm:
                vm["hb_power"] = "stopped"  # a guest shutdown stops the VM (still allocated, still billed)

        guest = guests[key] = Guest(vm["hb_custom_data"], powered_off)
        guest.boot()

    def evict(name: str) -> None:
        """Azure evicts a Spot VM (evictionPolicy Deallocate): the guest dies, the VM is deallocated."""
        for key, vm in vms.items():
            if key[2] == name.lower():
                if (g := guests.get(key)) is not None:
                    g.kill()
                vm["hb_power"] = "deallocated"

    app.state.evict = evict

    @app.get("/subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/operations/{op}")
    def operation(sub: str, loc: str, op: str) -> dict[str, Any]:
        if ops.get(op, 0) > 0:
            ops[op] -= 1
            return {"name": op, "status": "InProgress"}
        for key, vm in vms.items():
            if vm["properties"].get("provisioningState") == "Creating":
                vm["properties"]["provisioningState"] = "Succeeded"
                boot(key, vm)
        return {"name": op, "status": "Succeeded"}

    extensions: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    app.state.extensions = extensions

    @app.put(comp + "/virtualMachines/{name}/extensions/{ext}")
    async def put_extension(sub: str, rg: str, name: str, ext: str, request: Request) -> Response:
        version = request.query_params.get("api-version")
        if not version:
            return err(400, "MissingApiVersionParameter", "The api-version query parameter (?api-version=) is "
                       "required for all requests.")
        if version not in COMPUTE_API_VERSIONS:
            return err(400, "NoRegisteredProviderFound", f"No registered resource provider found for API version "
                       f"'{version}' and type 'virtualMachines/extensions'.")
        vm = vms.get((sub, rg.lower(), name.lower()))
        if vm is None:
            return err(404, "ParentResourceNotFound", "Can not perform requested operation on nested resource. "
                       f"Parent resource '{name}' not found.")
        try:
            body = await request.json()
        except ValueError:
            return err(400, "InvalidRequestContent", "The request content was invalid and could not be deserialized.")
        props = body.get("properties") if isinstance(body, dict) else None
        if not isinstance(props, dict):
            return err(400, "InvalidParameter", "Required parameter 'properties' is missing (null).", "properties")
        for field in ("publisher", "type", "typeHandlerVersion"):
            if not isinstance(props.get(field), str) or not props[field]:
                return err(400, "InvalidParameter", f"Required parameter '{field}' is missing (null).", field)
        if "settings" in props and not isinstance(props["settings"], dict):
            return err(400, "InvalidParameter", "The value of parameter settings is invalid.", "settings")
        if body.get("location") not in (None, vm["location"]):
            return err(400, "InvalidParameter", f"The extension's location {body['location']} is not its VM's "
                       f"({vm['location']}).", "location")
        known = EXTENSIONS.get((props["publisher"], props["type"]))
        if known is None or props["typeHandlerVersion"] not in known:
            return err(404, "ArtifactNotFound", f"Extension with publisher '{props['publisher']}', type "
                       f"'{props['type']}', and type handler version '{props['typeHandlerVersion']}' could not be "
                       "found in the extension repository.")
        key = (sub, rg.lower(), name.lower(), ext.lower())
        existed = key in extensions
        state = "Succeeded"
        if props["type"] == "NvidiaGpuDriverLinux":
            gpus = next((g for n, _, _, g, _ in SKUS if n == vm["properties"]["hardwareProfile"]["vmSize"]), 0)
            state = "Succeeded" if gpus else "Failed"  # the driver installs only where there is a GPU
            guest = guests.get((sub, rg.lower(), name.lower()))
            if gpus and guest is not None:
                guest.install_driver()
        extensions[key] = {"id": f"{vm['id']}/extensions/{ext}", "name": ext,
                           "type": "Microsoft.Compute/virtualMachines/extensions", "location": vm["location"],
                           "tags": body.get("tags") or {}, "properties": dict(props) | {"provisioningState": state}}
        return JSONResponse(extensions[key], status_code=200 if existed else 201)

    @app.get(comp + "/virtualMachines/{name}")
    def get_vm(sub: str, rg: str, name: str) -> Response:
        vm = vms.get((sub, rg.lower(), name.lower()))
        if vm is None:
            return JSONResponse({"error": {"code": "ResourceNotFound", "message": f"{name} not found"}}, 404)
        return JSONResponse(public(vm))

    @app.get(comp + "/virtualMachines/{name}/instanceView")
    def instance_view(sub: str, rg: str, name: str) -> Response:
        vm = vms.get((sub, rg.lower(), name.lower()))
        if vm is None:
            return err(404, "ResourceNotFound", f"{name} not found")
        return JSONResponse(view(vm))

    @app.post(comp + "/virtualMachines/{name}/retrieveBootDiagnosticsData")
    def boot_diagnostics(sub: str, rg: str, name: str, request: Request) -> Response:
        vm = vms.get((sub, rg.lower(), name.lower()))
        if vm is None:
            return err(404, "ResourceNotFound", f"{name} not found")
        if not ((vm["properties"].get("diagnosticsProfile") or {}).get("bootDiagnostics") or {}).get("enabled"):
            return err(409, "OperationNotAllowed", "Boot diagnostics is not enabled for this VM.")
        base = str(request.base_url).rstrip("/")
        vid = vm["properties"]["vmId"]
        return JSONResponse({"consoleScreenshotBlobUri": f"{base}/bootdiag/{vid}/screenshot.bmp?sig=x",
                             "serialConsoleLogBlobUri": f"{base}/bootdiag/{vid}/serialconsole.log?sig=x"})

    @app.get("/bootdiag/{vid}/serialconsole.log")
    def serial_log(vid: str) -> Response:
        for key, vm in vms.items():
            if vm["properties"]["vmId"] == vid:
                g = guests.get(key)
                return PlainTextResponse(g.console() if g is not None else "")
        return Response("<Error><Code>BlobNotFound</Code></Error>", status_code=404, media_type="application/xml")

    @app.delete(comp + "/virtualMachines/{name}")
    def delete_vm(sub: str, rg: str, name: str) -> Response:
        key = (sub, rg.lower(), name.lower())
        vm = vms.pop(key, None)
        if vm is None:
            return Response(status_code=204)
        if (g := guests.pop(key, None)) is not None:
            g.cleanup()
        for ekey in [k for k in extensions if k[:3] == key]:  # a VM's extensions are deleted with it
            del extensions[ekey]
        os_disk = vm["properties"]["storageProfile"]["osDisk"]
        if os_disk.get("deleteOption") == "Delete":
            disks.pop((sub, rg.lower(), os_disk["name"].lower()), None)
        else:
            disks[(sub, rg.lower(), os_disk["name"].lower())]["managedBy"] = None
        for ref in vm["properties"]["networkProfile"]["networkInterfaces"]:
            parts = ref["id"].split("/")
            nkey = (parts[2], parts[4].lower(), parts[-1].lower())
            if (ref.get("properties") or {}).get("deleteOption") == "Delete":
                nics.pop(nkey, None)
            elif nkey in nics:
                nics[nkey]["properties"]["virtualMachine"] = None
        return Response(status_code=200)

    @app.get(comp + "/virtualMachines")
    def list_vms(sub: str, rg: str, request: Request) -> dict[str, Any]:
        expand = request.query_params.get("$expand") == "instanceView"
        return {"value": [public(vm, expand) for (s, g, _), vm in vms.items() if s == sub and g == rg.lower()]}

    @app.get(comp + "/disks")
    def list_disks(sub: str, rg: str) -> dict[str, Any]:
        return {"value": [d | {"managedBy": d.get("managedBy")} for (s, g, _), d in disks.items()
                          if s == sub and g == rg.lower()]}

    @app.delete(comp + "/disks/{name}")
    def delete_disk(sub: str, rg: str, name: str) -> Response:
        d = disks.get((sub, rg.lower(), name.lower()))
        if d is None:
            return Response(status_code=204)
        if d.get("managedBy"):
            return err(409, "OperationNotAllowed", f"Disk {name} is attached to VM {d['managedBy']}.")
        del disks[(sub, rg.lower(), name.lower())]
        return Response(status_code=200)

    @app.get("/api/retail/prices")
    def prices(request: Request) -> dict[str, Any]:
        flt = request.query_params.get("$filter", "")
        rows: list[dict[str, Any]] = []
        for region in REGIONS:
            if f"armRegionName eq '{region}'" in flt:
                rows = price_rows(region)
        if "serviceName eq 'Virtual Machines'" not in flt:
            rows = []
        skip = int(request.query_params.get("$skip", "0"))
        page = rows[skip : skip + page_size]
        nxt = None
        if skip + page_size < len(rows):
            q = dict(request.query_params) | {"$skip": str(skip + page_size)}
            nxt = str(request.url.replace_query_params(**q))
        return {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                "Items": page, "NextPageLink": nxt, "Count": len(page)}

    return app


class ServerThread:
    """uvicorn serving ``app`` with TLS on a free 127.0.0.1 port, in a daemon thread."""

    def __init__(self, app: FastAPI, certfile: str, keyfile: str) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                    ssl_certfile=certfile, ssl_keyfile=keyfile))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the fake server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"https://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(5)
