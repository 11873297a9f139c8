"""A local fake of Azure Resource Manager (compute) and the Azure Retail Prices API, in their documented
wire formats (RECIPES §3), served by uvicorn over TLS in a thread. Only what the adapter calls."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

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

    @app.put("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}")
    async def put_vm(sub: str, rg: str, name: str, request: Request) -> Response:
        body = await request.json()
        region = body["location"]
        props = body.get("properties", {})
        vm_id = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}"
        props.setdefault("storageProfile", {}).setdefault("osDisk", {})["managedDisk"] = {
            "id": vm_id.replace("virtualMachines", "disks") + "_OsDisk"}
        props["provisioningState"] = "Creating"
        props["vmId"] = str(uuid.uuid4())
        vm = {"id": vm_id, "name": name, "type": "Microsoft.Compute/virtualMachines", "location": region,
              "tags": body.get("tags", {}), "properties": props}
        if body.get("zones"):
            vm["zones"] = body["zones"]
        existed = (sub, rg, name.lower()) in vms
        vms[(sub, rg, name.lower())] = vm
        op = uuid.uuid4().hex
        ops[op] = 1
        base = str(request.base_url).rstrip("/")
        return JSONResponse(vm, status_code=200 if existed else 201, headers={
            "Azure-AsyncOperation": f"{base}/subscriptions/{sub}/providers/Microsoft.Compute/locations/"
                                    f"{region}/operations/{op}?api-version=2024-07-01",
            "Retry-After": "0"})

    @app.get("/subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/operations/{op}")
    def operation(sub: str, loc: str, op: str) -> dict[str, Any]:
        if ops.get(op, 0) > 0:
            ops[op] -= 1
            return {"name": op, "status": "InProgress"}
        for vm in vms.values():
            if vm["properties"].get("provisioningState") == "Creating":
                vm["properties"]["provisioningState"] = "Succeeded"
        return {"name": op, "status": "Succeeded"}

    @app.get("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}")
    def get_vm(sub: str, rg: str, name: str) -> Response:
        vm = vms.get((sub, rg, name.lower()))
        if vm is None:
            return JSONResponse({"error": {"code": "ResourceNotFound", "message": f"{name} not found"}}, 404)
        return JSONResponse(vm)

    @app.delete("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}")
    def delete_vm(sub: str, rg: str, name: str) -> Response:
        if vms.pop((sub, rg, name.lower()), None) is None:
            return Response(status_code=204)
        return Response(status_code=200)

    @app.get("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines")
    def list_vms(sub: str, rg: str) -> dict[str, Any]:
        return {"value": [vm for (s, g, _), vm in vms.items() if s == sub and g == rg]}

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
