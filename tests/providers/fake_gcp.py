"""A local fake of the Compute Engine API (v1) and the Cloud Billing Catalog API, in their documented JSON
wire formats, served by uvicorn over TLS in a thread (see fake_azure.ServerThread). Only what the GCP
adapter and Libcloud's GCE driver call:

* ``/compute/v1/projects/{p}``: ``zones``, ``zones/{z}``, ``zones/{z}/machineTypes[/{t}]``,
  ``aggregated/machineTypes``, ``zones/{z}/acceleratorTypes[/{a}]``, ``global/networks/{n}``,
  ``zones/{z}/instances`` (insert -> operation), ``zones/{z}/instances/{i}`` (get, delete -> operation),
  ``aggregated/instances`` (with the ``filter`` language's ``labels.k = "v"`` and ``labels.k:*``),
  ``zones/{z}/disks/{d}``, ``aggregated/disks``, ``zones/{z}/operations/{o}``; list calls page with
  ``maxResults``/``pageToken``/``nextPageToken`` and refuse bad labels, names and filters with GCE's
  error JSON;
* ``/v1/services/{id}/skus``: Compute Engine SKUs (``description``, ``category``, ``serviceRegions``,
  ``pricingInfo[].pricingExpression``), paged with ``pageSize``/``pageToken``/``nextPageToken``;
* workload identity federation: ``POST /v1/token`` plays Security Token Service (``sts.googleapis.com``,
  REST reference "Method: token", RFC 8693 token exchange: form fields ``grant_type``, ``audience``,
  ``scope``, ``requested_token_type``, ``subject_token``, ``subject_token_type``; OAuth errors
  ``invalid_request``, ``unsupported_grant_type``, ``invalid_grant``, ``invalid_target``) and
  ``POST /v1/projects/-/serviceAccounts/{email}:generateAccessToken`` plays IAM Service Account Credentials
  (``iamcredentials.googleapis.com``: a federated bearer, JSON ``scope`` (required) / ``lifetime`` (at most
  ``3600s``) / ``delegates``; answers ``accessToken``/``expireTime``; Google JSON errors ``UNAUTHENTICATED``,
  ``INVALID_ARGUMENT``, ``NOT_FOUND``, ``PERMISSION_DENIED``). The pool's audience, the subject tokens it
  trusts and the service accounts federated principals may impersonate are ``app.state.wif``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from .fake_azure import ServerThread
from .guest import Guest

__all__ = ["make_app", "ServerThread", "billing_skus", "operation_error", "ZONES", "MACHINE_TYPES", "RATES"]

BASE = "https://www.googleapis.com/compute/v1/projects"
ZONES = {"us-central1-a": "us-central1", "us-central1-b": "us-central1", "us-central1-c": "us-central1",
         "europe-west1-b": "europe-west1"}
# name -> (guestCpus, memoryMb, accelerators, shared core); zones that sell it.
MACHINE_TYPES: dict[str, tuple[int, int, list[tuple[str, int]], bool]] = {
    "e2-small": (2, 2048, [], True),
    "n2-standard-4": (4, 16384, [], False),
    "n2d-standard-4": (4, 16384, [], False),
    "n1-standard-4": (4, 15360, [], False),
    "g2-standard-4": (4, 16384, [("nvidia-l4", 1)], False),
}
SOLD_IN = {
    "us-central1-a": ["e2-small", "n2-standard-4", "n2d-standard-4", "n1-standard-4", "g2-standard-4"],
    "us-central1-b": ["e2-small", "n2-standard-4", "n1-standard-4"],
    "us-central1-c": ["n2-standard-4"],
    "europe-west1-b": ["e2-small", "n2-standard-4", "n1-standard-4"],
}
ACCELERATORS = {"us-central1-a": [("nvidia-tesla-t4", 4)], "us-central1-b": [("nvidia-tesla-t4", 4)],
                "us-central1-c": [], "europe-west1-b": []}
# Billing rates in us-central1 (USD per vCPU hour / GiB hour / GPU hour): (on-demand, spot).
RATES = {
    ("N2 Instance Core", "CPU", "n2"): (0.031611, 0.007594),
    ("N2 Instance Ram", "RAM", "n2"): (0.004237, 0.001018),
    ("N2D AMD Instance Core", "CPU", "n2d"): (0.027502, 0.006606),
    ("N2D AMD Instance Ram", "RAM", "n2d"): (0.003686, 0.000886),
    ("E2 Instance Core", "CPU", "e2"): (0.021811, 0.006543),
    ("E2 Instance Ram", "RAM", "e2"): (0.002923, 0.000877),
    ("N1 Predefined Instance Core", "N1Standard", "n1"): (0.031611, 0.00698),
    ("N1 Predefined Instance Ram", "N1Standard", "n1"): (0.004237, 0.00094),
    ("G2 Instance Core", "CPU", "g2"): (0.024988, 0.00999),
    ("G2 Instance Ram", "RAM", "g2"): (0.002927, 0.00117),
    ("Nvidia Tesla T4 GPU", "GPU", "t4"): (0.35, 0.069),
    ("Nvidia L4 GPU", "GPU", "l4"): (0.5599, 0.2240),
}
REGION_FACTOR = {"us-central1": (1.0, "Americas"), "europe-west1": (1.1, "EMEA")}
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_METADATA_KEY = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
METADATA_VALUE_MAX = 256 * 1024
METADATA_TOTAL_MAX = 512 * 1024
_CLAUSE = re.compile(r'\(?\s*labels\.([a-z0-9_-]+)\s*(?:=\s*"([^"]*)"|:\s*\*)\s*\)?')


def _money(usd: float) -> dict[str, Any]:
    units = int(usd)
    return {"currencyCode": "USD", "units": str(units), "nanos": int(round((usd - units) * 1e9))}


def _sku(desc: str, group: str, usage: str, regions: list[str], unit: str, usd: float) -> dict[str, Any]:
    sku_id = uuid.uuid5(uuid.NAMESPACE_DNS, desc + usage).hex[:12].upper()
    return {
        "name": f"services/6F81-5844-456A/skus/{sku_id}", "skuId": sku_id, "description": desc,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute" if group != "Storage"
                     else "Storage", "resourceGroup": group, "usageType": usage},
        "serviceRegions": regions,
        "pricingInfo": [{
            "effectiveTime": "2026-10-01T00:00:00Z", "summary": "",
            "pricingExpression": {"usageUnit": unit, "displayQuantity": 1, "usageUnitDescription": unit,
                                  "baseUnit": "s", "baseUnitConversionFactor": 3600,
                                  "tieredRates": [{"startUsageAmount": 0, "unitPrice": _money(usd)}]},
            "currencyConversionRate": 1,
        }],
        "serviceProviderName": "Google",
    }


def billing_skus() -> list[dict[str, Any]]:
    """Compute Engine SKUs of the two fake regions, with spot rows and SKUs the parser must skip."""
    out = []
    for region, (factor, place) in REGION_FACTOR.items():
        for (desc, group, _), (od, spot) in RATES.items():
            unit = "GiBy.h" if "Ram" in desc else "h"
            out.append(_sku(f"{desc} running in {place}", group, "OnDemand", [region], unit, od * factor))
            out.append(_sku(f"Spot Preemptible {desc} running in {place}", group, "Preemptible", [region], unit,
                            spot * factor))
        # Noise a real catalog has: commitments, sole tenancy and custom premiums, storage, licences.
        out.append(_sku(f"Commitment v1: N2 Cpu in {place} for 1 Year", "CPU", "Commit1Yr", [region], "h", 0.02))
        out.append(_sku(f"N2 Sole Tenancy Instance Core running in {place}", "CPU", "OnDemand", [region], "h",
                        0.0348))
        out.append(_sku(f"N2 Custom Instance Core running in {place}", "CPU", "OnDemand", [region], "h", 0.0332))
        out.append(_sku(f"Storage PD Capacity in {place}", "Storage", "OnDemand", [region], "GiBy.mo", 0.04))
    return out


def operation_error(code: str, message: str = "injected") -> tuple[int, bytes, dict[str, str]]:
    """A finished GCE operation carrying an error (how GCE reports ``ZONE_RESOURCE_POOL_EXHAUSTED`` and
    ``QUOTA_EXCEEDED`` of an insert): HTTP 200, ``status: DONE``, ``error.errors[0].code``. For FaultProxy."""
    body = {"kind": "compute#operation", "id": "1", "name": "operation-injected", "operationType": "insert",
            "status": "DONE", "progress": 100, "httpErrorStatusCode": 503, "httpErrorMessage": "SERVICE UNAVAILABLE",
            "error": {"errors": [{"code": code, "message": message}]}}
    return 200, json.dumps(body).encode(), {"Content-Type": "application/json"}


def _error(status: int, reason: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": status, "message": message,
                                   "errors": [{"domain": "global", "reason": reason, "message": message}]}},
                        status_code=status)


def _invalid_instance(body: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of what GCE's ``instances.insert`` refuses in ``body`` (Compute API v1 reference:
    one boot disk with a source image or disk, at least one NIC on a network/subnetwork, metadata key and
    size rules, Spot VM scheduling rules), else ``None``."""
    disks = body.get("disks") or []
    if not disks:
        return "required", "Invalid value for field 'resource.disks': ''. At least one disk is required."
    boots = [d for d in disks if d.get("boot")]
    if len(boots) != 1:
        return "invalid", "Invalid value for field 'resource.disks': exactly one boot disk must be specified."
    init = boots[0].get("initializeParams") or {}
    if not boots[0].get("source") and not init.get("sourceImage"):
        return "required", "Required field 'resource.disks[0].initializeParams.sourceImage' not specified"
    nics = body.get("networkInterfaces") or []
    if not nics:
        return "required", "Required field 'resource.networkInterfaces' not specified"
    for n in nics:
        net = str(n.get("network") or "")
        if not net and not n.get("subnetwork"):
            return "required", "Required field 'resource.networkInterfaces[0].network' not specified"
        if net and net.rsplit("/", 1)[-1] != "default":
            return "notFound", f"The resource '{net}' was not found"
    items = (body.get("metadata") or {}).get("items") or []
    total = 0
    for item in items:
        key, value = str(item.get("key", "")), str(item.get("value", ""))
        if not _METADATA_KEY.match(key):
            return "invalid", f"Invalid value for field 'resource.metadata': key '{key}'."
        if len(value.encode()) > METADATA_VALUE_MAX:
            return "invalid", f"Metadata value for key '{key}' is too large."
        total += len(value.encode()) + len(key)
    if total > METADATA_TOTAL_MAX:
        return "invalid", "The total size of all metadata is too large."
    sched = body.get("scheduling") or {}
    model = sched.get("provisioningModel", "STANDARD")
    if model not in ("STANDARD", "SPOT"):
        return "invalid", f"Invalid value for field 'resource.scheduling.provisioningModel': '{model}'."
    if model == "SPOT" and sched.get("preemptible") is False:
        return "invalid", "Scheduling: a SPOT VM cannot set preemptible to false."
    if (model == "SPOT" or sched.get("preemptible")) and sched.get("automaticRestart", True) is not False:
        return "invalid", "Invalid value for field 'resource.scheduling.automaticRestart': 'true'. Spot and " \
                          "preemptible instances cannot be automatically restarted."
    if (model == "SPOT" or sched.get("preemptible") or body.get("guestAccelerators")) and \
            sched.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
        return "invalid", "Invalid value for field 'resource.scheduling.onHostMaintenance': 'MIGRATE'. " \
                          "Instances with guest accelerators or Spot/preemptible instances do not support live " \
                          "migration."
    if sched.get("maxRunDuration") and sched.get("instanceTerminationAction") not in ("STOP", "DELETE"):
        return "invalid", "Scheduling.maxRunDuration needs instanceTerminationAction STOP or DELETE."
    return None


def _page(items: list[Any], request: Request, cap: int) -> tuple[list[Any], str | None]:
    size = min(int(request.query_params.get("maxResults", "500")), cap)
    start = int(request.query_params.get("pageToken") or 0)
    nxt = start + size
    return items[start:nxt], (str(nxt) if nxt < len(items) else None)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def make_app(project: str = "demo-proj", page_cap: int = 2, sku_page_cap: int = 7) -> FastAPI:
    """The fake. ``app.state.instances[(zone, name)]`` and ``app.state.disks`` are its live resources;
    ``page_cap``/``sku_page_cap`` cap the page sizes so that paging is exercised."""
    app = FastAPI()
    instances: dict[tuple[str, str], dict[str, Any]] = {}
    disks: dict[tuple[str, str], dict[str, Any]] = {}
    ops: dict[str, dict[str, Any]] = {}
    ids = itertools.count(4_000_000_000_000_000_001)
    app.state.instances = instances
    app.state.disks = disks
    app.state.requests = []
    app.state.exhausted = set()  # (zone, machine type) with no capacity: inserts end ZONE_RESOURCE_POOL_EXHAUSTED
    guests: dict[tuple[str, str], Guest] = {}
    app.state.guests = guests

    def preempt(zone: str, name: str) -> None:
        """GCE reclaims a Spot VM: the guest dies, the instance stops (instanceTerminationAction STOP)."""
        g = guests.get((zone, name))
        if g is not None:
            g.kill()
        instances[(zone, name)]["status"] = "TERMINATED"

    app.state.preempt = preempt

    def notice(zone: str, name: str) -> None:
        """GCE announces the preemption (instance/preempted TRUE) ~30 s before it stops the Spot VM."""
        guests[(zone, name)].notice()

    app.state.notice = notice
    root = f"/compute/v1/projects/{project}"
    link = f"{BASE}/{project}"

    app.state.bearers = set()  # access tokens seen on Compute calls
    app.state.issued = []  # access tokens the OAuth2 token endpoint handed out

    @app.post("/token")
    async def token(request: Request) -> Response:
        """Google's OAuth2 token endpoint (RFC 6749) for ADC refresh: a refresh_token grant only."""
        form = dict(await request.form())
        if form.get("grant_type") != "refresh_token" or not form.get("refresh_token"):
            return JSONResponse({"error": "invalid_grant", "error_description": "Bad Request"}, status_code=400)
        tok = f"ya29.adc-{uuid.uuid4().hex[:12]}"
        app.state.issued.append(tok)
        return JSONResponse({"access_token": tok, "expires_in": 3599, "token_type": "Bearer",
                             "scope": "https://www.googleapis.com/auth/cloud-platform"})

    wif: dict[str, Any] = {
        "audience": "//iam.googleapis.com/projects/123456789/locations/global/workloadIdentityPools/hb-pool/"
                    "providers/hb-oidc",
        "subject_tokens": set(),  # OIDC tokens of the external identity provider the pool trusts
        "service_accounts": {f"hb-broker@{project}.iam.gserviceaccount.com"},  # federated principals may use
        "federated": [],  # access tokens STS handed out
        "impersonated": [],  # access tokens generateAccessToken handed out
    }
    app.state.wif = wif

    def oauth_error(error: str, description: str) -> JSONResponse:
        return JSONResponse({"error": error, "error_description": description}, status_code=400)

    def google_error(status: int, code: str, message: str) -> JSONResponse:
        return JSONResponse({"error": {"code": status, "message": message, "status": code}}, status_code=status)

    exchange = "urn:ietf:params:oauth:grant-type:token-exchange"
    access_token_type = "urn:ietf:params:oauth:token-type:access_token"
    subject_types = {"urn:ietf:params:oauth:token-type:jwt", "urn:ietf:params:oauth:token-type:id_token",
                     "urn:ietf:params:oauth:token-type:saml2", "urn:ietf:params:aws:token-type:aws4_request"}

    @app.post("/v1/token")
    async def sts_token(request: Request) -> Response:
        """Security Token Service: exchange an external credential for a federated access token."""
        ctype = request.headers.get("content-type", "")
        if ctype.startswith("application/x-www-form-urlencoded"):
            form = {k: str(v) for k, v in (await request.form()).items()}
        elif ctype.startswith("application/json"):  # the REST form: the same fields in camelCase
            raw = await request.json()
            camel = {"grantType": "grant_type", "requestedTokenType": "requested_token_type",
                     "subjectToken": "subject_token", "subjectTokenType": "subject_token_type"}
            form = {camel.get(k, k): str(v) for k, v in (raw if isinstance(raw, dict) else {}).items()}
        else:
            return oauth_error("invalid_request", f"Unsupported content type {ctype!r}.")
        if not form.get("grant_type"):
            return oauth_error("invalid_request", "The grant_type parameter is required.")
        if form["grant_type"] != exchange:
            return oauth_error("unsupported_grant_type", f"Unsupported grant_type: {form['grant_type']}.")
        for field in ("requested_token_type", "subject_token", "subject_token_type", "audience"):
            if not form.get(field):
                return oauth_error("invalid_request", f"The {field} parameter is required.")
        if form["requested_token_type"] != access_token_type:
            return oauth_error("invalid_request", f"Invalid requested_token_type: {form['requested_token_type']}.")
        if form["subject_token_type"] not in subject_types:
            return oauth_error("invalid_request", f"Invalid subject_token_type: {form['subject_token_type']}.")
        if form["audience"] != wif["audience"]:
            return oauth_error("invalid_target", "The target service indicated by the \"audience\" parameters is "
                               "invalid. This might either be because the pool or provider is disabled or deleted "
                               "or because it doesn't exist.")
        if form["subject_token"] not in wif["subject_tokens"]:
            return oauth_error("invalid_grant", "The provided subject token is not valid for this provider.")
        if "options" in form:
            try:
                json.loads(form["options"])
            except ValueError:
                return oauth_error("invalid_request", "The options parameter is not valid JSON.")
        tok = f"ya29.sts-{uuid.uuid4().hex[:12]}"
        wif["federated"].append(tok)
        return JSONResponse({"access_token": tok, "issued_token_type": access_token_type, "token_type": "Bearer",
                             "expires_in": 3600})

    @app.post("/v1/projects/-/serviceAccounts/{target}")
    async def generate_access_token(target: str, request: Request) -> Response:
        """IAM Service Account Credentials: a short-lived access token of a service account."""
        email, _, method = target.partition(":")
        if method != "generateAccessToken":
            return google_error(404, "NOT_FOUND", f"Method {method or '(none)'} not found.")
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or auth.removeprefix("Bearer ") not in wif["federated"]:
            return google_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected "
                                "OAuth 2 access token, login cookie or other valid authentication credential.")
        try:
            body = await request.json()
        except ValueError:
            return google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        if not isinstance(body, dict):
            return google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        scope = body.get("scope")
        if not isinstance(scope, list) or not scope or not all(isinstance(x, str) and x for x in scope):
            return google_error(400, "INVALID_ARGUMENT", "Scope required.")
        lifetime = body.get("lifetime", "3600s")
        m = re.fullmatch(r"(\d+)(\.\d+)?s", str(lifetime))
        if m is None or not 1 <= float(str(lifetime)[:-1]) <= 3600:
            return google_error(400, "INVALID_ARGUMENT", f"Invalid lifetime {lifetime!r}: a duration in seconds "
                                "up to 3600s.")
        if not isinstance(body.get("delegates") or [], list):  # null is the default (proto3 JSON)
            return google_error(400, "INVALID_ARGUMENT", "Invalid value at 'delegates'.")
        if email not in wif["service_accounts"]:
            if email.endswith(".iam.gserviceaccount.com"):
                return google_error(403, "PERMISSION_DENIED", "Permission 'iam.serviceAccounts.getAccessToken' "
                                    "denied on resource (or it may not exist).")
            return google_error(404, "NOT_FOUND", f"Service account {email} not found.")
        tok = f"ya29.sa-{uuid.uuid4().hex[:12]}"
        wif["impersonated"].append(tok)
        expire = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=int(float(str(lifetime)[:-1])))
        return JSONResponse({"accessToken": tok, "expireTime": expire.strftime("%Y-%m-%dT%H:%M:%SZ")})

    serial = asyncio.Lock()

    @app.middleware("http")
    async def record(request: Request, call_next: Any) -> Response:
        app.state.requests.append((request.method, request.url.path))
        auth = request.headers.get("authorization", "")
        if request.url.path.startswith("/compute/") and auth.startswith("Bearer "):
            app.state.bearers.add(auth.removeprefix("Bearer "))
        if request.url.path.startswith("/compute/") and not request.headers.get("authorization", "").startswith(
                "Bearer "):
            return _error(401, "required", "Login Required.")
        async with serial:  # each request applies atomically (the broker may launch several VMs at once)
            return await call_next(request)

    def zone_doc(z: str) -> dict[str, Any]:
        return {"kind": "compute#zone", "id": str(2000 + list(ZONES).index(z)), "name": z, "status": "UP",
                "description": z, "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
                "region": f"{link}/regions/{ZONES[z]}", "selfLink": f"{link}/zones/{z}"}

    def mt_doc(z: str, name: str) -> dict[str, Any]:
        cpus, mem, accs, shared = MACHINE_TYPES[name]
        doc: dict[str, Any] = {"kind": "compute#machineType", "id": str(abs(hash(name)) % 10**9), "name": name,
                               "description": f"{cpus} vCPUs, {mem / 1024:g} GB RAM", "guestCpus": cpus,
                               "memoryMb": mem, "imageSpaceGb": 0, "maximumPersistentDisks": 128,
                               "maximumPersistentDisksSizeGb": "263168", "zone": z, "isSharedCpu": shared,
                               "selfLink": f"{link}/zones/{z}/machineTypes/{name}"}
        if accs:
            doc["accelerators"] = [{"guestAcceleratorType": a, "guestAcceleratorCount": n} for a, n in accs]
        return doc

    def acc_doc(z: str, name: str, cards: int) -> dict[str, Any]:
        return {"kind": "compute#acceleratorType", "id": str(abs(hash(name)) % 10**6), "name": name,
                "description": name, "zone": f"{link}/zones/{z}", "maximumCardsPerInstance": cards,
                "selfLink": f"{link}/zones/{z}/acceleratorTypes/{name}"}

    def new_op(z: str, kind: str, target: str, apply: Any, error: str | None = None) -> dict[str, Any]:
        name = f"operation-{uuid.uuid4().hex[:16]}"
        op = {"kind": "compute#operation", "id": str(next(ids)), "name": name, "zone": f"{link}/zones/{z}",
              "operationType": kind, "targetLink": target, "status": "RUNNING", "progress": 0,
              "insertTime": _now(), "startTime": _now(), "user": "sa@demo-proj.iam.gserviceaccount.com",
              "selfLink": f"{link}/zones/{z}/operations/{name}"}
        ops[name] = {"doc": op, "apply": apply, "error": error}
        return op

    @app.get(f"{root}/zones")
    def zones(request: Request) -> dict[str, Any]:
        page, nxt = _page([zone_doc(z) for z in ZONES], request, 500)
        out: dict[str, Any] = {"kind": "compute#zoneList", "items": page, "selfLink": f"{link}/zones"}
        if nxt:
            out["nextPageToken"] = nxt
        return out

    @app.get(f"{root}/zones/{{zone}}")
    def zone(zone: str) -> Response:
        if zone not in ZONES:
            return _error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}' was not found")
        return JSONResponse(zone_doc(zone))

    @app.get(f"{root}/zones/{{zone}}/machineTypes")
    def machine_types(zone: str, request: Request) -> Response:
        if zone not in ZONES:
            return _error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}' was not found")
        page, nxt = _page([mt_doc(zone, n) for n in SOLD_IN[zone]], request, page_cap)
        out: dict[str, Any] = {"kind": "compute#machineTypeList", "items": page}
        if nxt:
            out["nextPageToken"] = nxt
        return JSONResponse(out)

    @app.get(f"{root}/zones/{{zone}}/machineTypes/{{name}}")
    def machine_type(zone: str, name: str) -> Response:
        if name not in SOLD_IN.get(zone, []):
            return _error(404, "notFound",
                          f"The resource 'projects/{project}/zones/{zone}/machineTypes/{name}' was not found")
        return JSONResponse(mt_doc(zone, name))

    @app.get(f"{root}/aggregated/machineTypes")
    def aggregated_machine_types() -> dict[str, Any]:
        return {"kind": "compute#machineTypeAggregatedList",
                "items": {f"zones/{z}": {"machineTypes": [mt_doc(z, n) for n in names]}
                          for z, names in SOLD_IN.items()}}

    @app.get(f"{root}/zones/{{zone}}/acceleratorTypes")
    def accelerator_types(zone: str, request: Request) -> dict[str, Any]:
        page, nxt = _page([acc_doc(zone, n, c) for n, c in ACCELERATORS.get(zone, [])], request, page_cap)
        out: dict[str, Any] = {"kind": "compute#acceleratorTypeList", "items": page}
        if nxt:
            out["nextPageToken"] = nxt
        return out

    @app.get(f"{root}/zones/{{zone}}/acceleratorTypes/{{name}}")
    def accelerator_type(zone: str, name: str) -> Response:
        for n, c in ACCELERATORS.get(zone, []):
            if n == name:
                return JSONResponse(acc_doc(zone, n, c))
        return _error(404, "notFound", f"acceleratorType {name} not found in {zone}")

    @app.get(f"{root}/global/networks/{{name}}")
    def network(name: str) -> Response:
        if name != "default":
            return _error(404, "notFound", f"The resource 'projects/{project}/global/networks/{name}' was not found")
        return JSONResponse({"kind": "compute#network", "id": "77", "name": "default", "autoCreateSubnetworks": True,
                             "selfLink": f"{link}/global/networks/default", "subnetworks": []})

    @app.post(f"{root}/zones/{{zone}}/instances")
    async def insert(zone: str, request: Request) -> Response:
        body = await request.json()
        name = str(body.get("name", ""))
        if zone not in ZONES:
            return _error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}' was not found")
        if not _NAME.match(name):
            return _error(400, "invalid", f"Invalid value for field 'resource.name': '{name}'.")
        labels = body.get("labels") or {}
        for k, v in labels.items():
            if not _LABEL_KEY.match(k) or not _LABEL_VALUE.match(str(v)):
                return _error(400, "invalid", f"Invalid value for field 'resource.labels': '{k}={v}'.")
        if not body.get("machineType"):
            return _error(400, "required", "Required field 'resource.machineType' not specified")
        mtype = str(body.get("machineType", "")).rsplit("/", 1)[-1]
        if mtype not in SOLD_IN[zone]:
            return _error(400, "invalid", f"Invalid value for field 'resource.machineType': '{mtype}'.")
        problem = _invalid_instance(body)
        if problem is not None:
            return _error(400, *problem)
        inst_link = f"{link}/zones/{zone}/instances/{name}"
        if (zone, mtype) in app.state.exhausted:  # GCE accepts the insert, then the operation fails
            return JSONResponse(new_op(zone, "insert", inst_link, lambda: None, "ZONE_RESOURCE_POOL_EXHAUSTED"))
        if (zone, name) in instances:
            return _error(409, "alreadyExists",
                          f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists")
        boot = next(d for d in body["disks"] if d.get("boot"))
        init = boot.get("initializeParams") or {}
        disk_name = init.get("diskName") or name
        disk_link = f"{link}/zones/{zone}/disks/{disk_name}"
        disks[(zone, disk_name)] = {
            "kind": "compute#disk", "id": str(next(ids)), "name": disk_name, "sizeGb": str(init.get("diskSizeGb")
                                                                                            or 10),
            "zone": f"{link}/zones/{zone}", "status": "READY", "sourceImage": init.get("sourceImage"),
            "type": f"{link}/zones/{zone}/diskTypes/pd-balanced", "users": [inst_link], "selfLink": disk_link,
            "creationTimestamp": _now(), "labels": init.get("labels") or {},
        }
        asked = body["networkInterfaces"][0]
        nic = {"kind": "compute#networkInterface", "name": "nic0",
               "network": f"{link}/global/networks/default", "networkIP": f"10.128.0.{len(instances) + 2}",
               "accessConfigs": [{"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT", "name": "External NAT",
                                  "natIP": f"34.1.2.{len(instances) + 2}"} for _ in asked.get("accessConfigs") or []]}
        inst = {
            "kind": "compute#instance", "id": str(next(ids)), "creationTimestamp": _now(), "name": name,
            "tags": {"fingerprint": "42WmSpB8rSM="}, "machineType": f"{link}/zones/{zone}/machineTypes/{mtype}",
            "status": "PROVISIONING", "zone": f"{link}/zones/{zone}", "networkInterfaces": [nic],
            "disks": [{"kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE",
                       "source": disk_link, "deviceName": boot.get("deviceName", name), "index": 0, "boot": True,
                       "autoDelete": bool(boot.get("autoDelete", True))}],
            "metadata": {"kind": "compute#metadata", "fingerprint": "abc=",
                         "items": (body.get("metadata") or {}).get("items") or []},
            "serviceAccounts": body.get("serviceAccounts") or [],
            "selfLink": inst_link, "scheduling": body.get("scheduling") or {"onHostMaintenance": "MIGRATE",
                                                                               "automaticRestart": True,
                                                                               "preemptible": False},
            "labels": labels, "labelFingerprint": "lbl=", "cpuPlatform": "Unknown CPU Platform",
        }
        if body.get("guestAccelerators"):
            inst["guestAccelerators"] = body["guestAccelerators"]
        instances[(zone, name)] = inst

        script = next((i.get("value") for i in inst["metadata"]["items"] if i.get("key") == "startup-script"), None)

        def powered_off() -> None:
            if (zone, name) in instances:
                instances[(zone, name)]["status"] = "TERMINATED"

        guest = guests[(zone, name)] = Guest(script, powered_off)

        def started() -> None:
            if (zone, name) in instances:
                instances[(zone, name)]["status"] = "RUNNING"
                guest.boot()

        return JSONResponse(new_op(zone, "insert", inst_link, started))

    @app.get(f"{root}/zones/{{zone}}/operations/{{op}}")
    def operation(zone: str, op: str) -> Response:
        entry = ops.get(op)
        if entry is None:
            return _error(404, "notFound", f"operation {op} not found")
        doc = entry["doc"]
        if doc["status"] != "DONE":
            doc.update({"status": "DONE", "progress": 100, "endTime": _now()})
            if entry["error"]:
                doc.update({"httpErrorStatusCode": 503, "httpErrorMessage": "SERVICE UNAVAILABLE",
                            "error": {"errors": [{"code": entry["error"], "message": f"The zone '{doc['zone']}' "
                                                  "does not have enough resources available to fulfill the "
                                                  "request. Try a different zone, or try again later."}]}})
            else:
                entry["apply"]()
        return JSONResponse(doc)

    @app.get(f"{root}/zones/{{zone}}/instances/{{name}}")
    def get_instance(zone: str, name: str) -> Response:
        inst = instances.get((zone, name))
        if inst is None:
            return _error(404, "notFound",
                          f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
        return JSONResponse(inst)

    @app.delete(f"{root}/zones/{{zone}}/instances/{{name}}")
    def delete_instance(zone: str, name: str) -> Response:
        inst = instances.get((zone, name))
        if inst is None:
            return _error(404, "notFound",
                          f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
        inst["status"] = "STOPPING"
        g = guests.pop((zone, name), None)
        if g is not None:
            g.cleanup()

        def gone() -> None:
            gone_inst = instances.pop((zone, name), None)
            for d in (gone_inst or {}).get("disks", []):
                if d.get("autoDelete"):
                    disks.pop((zone, d["source"].rsplit("/", 1)[-1]), None)

        return JSONResponse(new_op(zone, "delete", inst["selfLink"], gone))

    def matching(request: Request) -> list[dict[str, Any]] | JSONResponse:
        flt = request.query_params.get("filter", "").strip()
        wanted: list[tuple[str, str | None]] = [(m.group(1), m.group(2)) for m in _CLAUSE.finditer(flt)]
        if _CLAUSE.sub("", flt).strip():
            return _error(400, "invalid", f"Invalid value for field 'filter': '{flt}'. Invalid list filter "
                                          "expression.")
        out = []
        for (_, _), inst in sorted(instances.items()):
            labels = inst.get("labels") or {}
            if all((k in labels) if v is None else labels.get(k) == v for k, v in wanted):
                out.append(inst)
        return out

    @app.get(f"{root}/aggregated/instances")
    def aggregated_instances(request: Request) -> Response:
        found = matching(request)
        if isinstance(found, JSONResponse):
            return found
        page, nxt = _page(found, request, page_cap)
        items: dict[str, Any] = {}
        for z in ZONES:
            these = [i for i in page if i["zone"].endswith(f"/zones/{z}")]
            items[f"zones/{z}"] = {"instances": these} if these else {
                "warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope "
                            f"'zones/{z}' on this page.", "data": [{"key": "scope", "value": f"zones/{z}"}]}}
        out: dict[str, Any] = {"kind": "compute#instanceAggregatedList", "items": items,
                               "selfLink": f"{link}/aggregated/instances"}
        if nxt:
            out["nextPageToken"] = nxt
        return JSONResponse(out)

    @app.get(f"{root}/zones/{{zone}}/instances")
    def list_instances(zone: str, request: Request) -> Response:
        found = matching(request)
        if isinstance(found, JSONResponse):
            return found
        return JSONResponse({"kind": "compute#instanceList",
                             "items": [i for i in found if i["zone"].endswith(f"/zones/{zone}")]})

    @app.get(f"{root}/zones/{{zone}}/instances/{{name}}/serialPort")
    def serial_port(zone: str, name: str, request: Request) -> Response:
        inst = instances.get((zone, name))
        if inst is None:
            return _error(404, "notFound",
                          f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found")
        port = request.query_params.get("port", "1")
        if port not in ("1", "2", "3", "4"):
            return _error(400, "invalid", f"Invalid value for field 'port': '{port}'. Must be in [1, 4].")
        g = guests.get((zone, name))
        text = g.console() if g is not None and port == "1" else ""
        start = int(request.query_params.get("start") or 0)
        return JSONResponse({"kind": "compute#serialPortOutput", "contents": text[start:], "start": str(start),
                             "next": str(len(text)), "selfLink": f"{inst['selfLink']}/serialPort"})

    @app.get(f"{root}/zones/{{zone}}/disks/{{name}}")
    def get_disk(zone: str, name: str) -> Response:
        disk = disks.get((zone, name))
        if disk is None:
            return _error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/disks/{name}' was "
                                           "not found")
        return JSONResponse(disk)

    @app.delete(f"{root}/zones/{{zone}}/disks/{{name}}")
    def delete_disk(zone: str, name: str) -> Response:
        disk = disks.get((zone, name))
        if disk is None:
            return _error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}/disks/{name}' was "
                                           "not found")
        if disk.get("users"):
            return _error(400, "resourceInUseByAnotherResource", f"The disk resource '{disk['selfLink']}' is "
                          f"already being used by '{disk['users'][0]}'")
        return JSONResponse(new_op(zone, "delete", disk["selfLink"], lambda: disks.pop((zone, name), None)))

    @app.get(f"{root}/aggregated/disks")
    def aggregated_disks(request: Request) -> dict[str, Any]:
        flt = request.query_params.get("filter", "")
        wanted = [(m.group(1), m.group(2)) for m in _CLAUSE.finditer(flt)]
        items: dict[str, Any] = {}
        for (z, _), d in sorted(disks.items()):
            labels = d.get("labels") or {}
            if not all((k in labels) if v is None else labels.get(k) == v for k, v in wanted):
                continue
            items.setdefault(f"zones/{z}", {"disks": []})["disks"].append(d)
        return {"kind": "compute#diskAggregatedList", "items": items}

    @app.get("/v1/services/{service}/skus")
    def skus(service: str, request: Request) -> Response:
        if service != "6F81-5844-456A":
            return JSONResponse({"error": {"code": 404, "message": f"service {service} not found",
                                           "status": "NOT_FOUND"}}, status_code=404)
        if request.query_params.get("currencyCode", "USD") != "USD":
            return JSONResponse({"error": {"code": 400, "message": "only USD here", "status": "INVALID_ARGUMENT"}},
                                status_code=400)
        rows = billing_skus()
        size = min(int(request.query_params.get("pageSize", "5000")), sku_page_cap)
        start = int(request.query_params.get("pageToken") or 0)
        nxt = start + size
        return JSONResponse({"skus": rows[start:nxt], "nextPageToken": str(nxt) if nxt < len(rows) else ""})

    return app
