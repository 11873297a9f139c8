"""GCP Compute Engine: Libcloud's GCE driver for zones, machine types and the instance lifecycle, and the
Cloud Billing Catalog API (over httpx) for prices.

* offers: machine types of every configured zone (``GET /zones/{z}/machineTypes``, paged with
  ``nextPageToken``; fields ``guestCpus``, ``memoryMb``, ``accelerators``), one offer per machine type and
  **region** (``zone=None``; :meth:`GcpProvider.launch` picks a zone). Prices come from the Billing Catalog
  (``GET /v1/services/6F81-5844-456A/skus``, paged): GCE bills a machine type as ``vCPUs x core rate + GiB x
  RAM rate (+ GPUs x GPU rate)`` of its *family*, so :func:`parse_billing_skus` reads the per-family rates
  from SKU descriptions ("N2 Instance Core running in Americas", "N2D AMD Instance Ram running in ...",
  "Nvidia Tesla T4 GPU running in ...") per ``serviceRegions`` entry, on-demand (``usageType OnDemand``)
  and spot (``Preemptible``) apart, and :func:`price_machine_type` composes them. The family is the part of
  the name before the first ``-`` (so ``n2d`` is not priced as ``n2``, unlike Libcloud's bundled prices),
  and shared-core E2 types are billed for their fraction of a vCPU. N1 types also get offers with
  attachable GPUs the zone sells (``acceleratorTypes``), named like the bundled catalog:
  ``n1-standard-4+T4:1``.
* lifecycle: one instance per unit named ``hb-<hash of request id>-<n>`` (a retried launch finds them by
  name/label: idempotent per request id). GCE labels allow only ``[a-z0-9_-]`` (at most 63 characters), so
  tags are sanitized into labels by :func:`gce_label` and the **original tags are kept** in the instance
  metadata item ``hb-tags`` (JSON); listing filters on the server by label
  (``labels.hb-request = "..."``) and then checks the original tags exactly. Instance ids are
  ``<zone>/<name>``. A launch without a zone tries the region's zones in order and moves to the next zone on
  ``ZONE_RESOURCE_POOL_EXHAUSTED`` as long as nothing was created for the request yet.

Credentials: a service-account JSON key (``credentials_file``, else ``GOOGLE_APPLICATION_CREDENTIALS``), through
Libcloud's own OAuth2 flow (it caches the token in ``token_cache``, default ``~/.google_libcloud_auth.<project>``);
any other credential goes through google-auth: an ADC file of another type (``authorized_user`` from
``gcloud auth application-default login``, ``external_account`` for workload identity federation), else
Application Default Credentials (the GKE workload identity / GCE metadata server), or google-auth
``credentials`` passed in. Project from ``project``, else ``GOOGLE_CLOUD_PROJECT``, else the key's or ADC's.
``endpoint`` / ``billing_url`` / ``ca_bundle`` point at other endpoints (tests, private service connect).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
from libcloud.common.google import GoogleBaseConnection, ResourceExistsError, ResourceNotFoundError
from libcloud.compute.drivers.gce import GCEConnection, GCENodeDriver

from broker.errors import AuthError, CapacityError, InvalidRequestError, ProviderError
from broker.model import Capacity, Instance, InstanceState, InstanceType, JobSpec, Location, Offer, Provenance

from .base import TAG_JOB, TAG_REQUEST, Capability, launch_tags, matches_tags, reclaimed_error, require_count
from .bootstrap import Report, parse_report, runtime_limit_seconds, script_for
from .errors import map_errors
from .images import GCP_IMAGES, pick

__all__ = [
    "GcpProvider",
    "BillingRates",
    "parse_billing_skus",
    "price_machine_type",
    "gce_label",
    "gce_labels",
    "accelerator_of",
    "split_gpu_type",
    "COMPUTE_SERVICE_ID",
    "DEFAULT_BILLING_URL",
    "TAGS_METADATA_KEY",
    "STARTUP_SCRIPT_KEY",
]

COMPUTE_SERVICE_ID = "6F81-5844-456A"  # the Compute Engine service in the Cloud Billing Catalog
DEFAULT_BILLING_URL = "https://cloudbilling.googleapis.com"
DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
TAGS_METADATA_KEY = "hb-tags"
STARTUP_SCRIPT_KEY = "startup-script"  # run as root by the guest environment at boot; output on serial port 1
METADATA_VALUE_MAX_BYTES = 256 * 1024  # GCE's limit on one metadata value
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
LABEL_MAX = 63

# Shared-core machine types are billed for a fraction of one vCPU (GCE pricing page).
SHARED_CORE_VCPUS = {"e2-micro": 0.25, "e2-small": 0.5, "e2-medium": 1.0}
# Description words of families whose SKU does not start with the family name.
_FAMILY_WORDS = {"compute optimized": "c2", "memory-optimized": "m1", "memory optimized": "m1"}
# GCE accelerator type name -> the model name used across the catalog.
_ACCELERATORS = {
    "nvidia-tesla-t4": "T4", "nvidia-tesla-v100": "V100", "nvidia-tesla-p100": "P100",
    "nvidia-tesla-p4": "P4", "nvidia-tesla-k80": "K80", "nvidia-tesla-a100": "A100",
    "nvidia-a100-80gb": "A100-80GB", "nvidia-l4": "L4", "nvidia-h100-80gb": "H100",
    "nvidia-h100-mega-80gb": "H100-MEGA", "nvidia-h200-141gb": "H200", "nvidia-b200": "B200",
}
_GPU_MEMORY_GIB = {"T4": 16.0, "V100": 16.0, "P100": 16.0, "P4": 8.0, "K80": 12.0, "A100": 40.0,
                   "A100-80GB": 80.0, "L4": 24.0, "H100": 80.0, "H100-MEGA": 80.0, "H200": 141.0, "B200": 180.0}
# N1 hosts that take attachable GPUs: {model: {count: (max vCPUs, max memory GiB)}} (GCP's published limits).
N1_GPU_LIMITS: dict[str, dict[int, tuple[float, float]]] = {
    "T4": {1: (48, 312), 2: (48, 312), 4: (96, 624)},
    "P4": {1: (24, 156), 2: (48, 312), 4: (96, 624)},
    "V100": {1: (12, 78), 2: (24, 156), 4: (48, 312), 8: (96, 624)},
    "P100": {1: (16, 104), 2: (32, 208), 4: (96, 624)},
}
_STATE = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "REPAIRING": InstanceState.RUNNING,
    # still ending (the guest powers off after reporting): finished only once the exit code is read
    "STOPPING": InstanceState.RUNNING,
    "SUSPENDING": InstanceState.RUNNING,
    "SUSPENDED": InstanceState.TERMINATED,
    "STOPPED": InstanceState.TERMINATED,
    "TERMINATED": InstanceState.TERMINATED,
}
_SPOT_PREFIX = re.compile(r"^(?:Spot Preemptible|Preemptible)\s+", re.IGNORECASE)
_CORE_RAM = re.compile(
    r"^(?P<fam>.+?)\s+(?:(?:AMD|Intel|Arm)\s+)?(?:Predefined\s+)?(?:Instance\s+)?(?P<kind>Core|Ram)"
    r"\s+running in\s+\S.*$"
)
_GPU = re.compile(r"^Nvidia\s+(?:Tesla\s+)?(?P<model>.+?)\s+GPU\s+running in\s+\S.*$", re.IGNORECASE)
_GPU_TYPE = re.compile(r"^(?P<host>[a-z0-9-]+)\+(?P<acc>[A-Za-z0-9-]+):(?P<n>\d+)$")
_LABEL_BAD = re.compile(r"[^a-z0-9_-]")


# -- labels -----------------------------------------------------------------------------------------------


def gce_label(value: str, *, key: bool = False) -> str:
    """``value`` as a GCE label key or value: lowercase ``[a-z0-9_-]``, at most 63 characters (long values
    keep a hash suffix so different values stay different); a key also starts with a letter.

    The mapping is many-to-one (``Job/1`` and ``job_1`` give the same label), which is why the original
    tags travel in instance metadata and listing re-checks them exactly."""
    out = _LABEL_BAD.sub("_", value.lower())
    if key and not out[:1].isalpha():
        out = "k" + out
    if len(out) > LABEL_MAX:
        out = out[: LABEL_MAX - 11] + "-" + hashlib.sha256(value.encode()).hexdigest()[:10]
    return out


def gce_labels(tags: Mapping[str, str]) -> dict[str, str]:
    """Tags as GCE labels (see :func:`gce_label`)."""
    return {gce_label(k, key=True): gce_label(v) for k, v in tags.items()}


def _label_filter(tags: Mapping[str, str] | None) -> str:
    """A Compute API ``filter`` expression: every instance of ours, narrowed by each wanted tag's label."""
    parts = [f"(labels.{TAG_REQUEST}:*)"]
    for k, v in gce_labels(tags or {}).items():
        parts.append(f'(labels.{k} = "{v}")')
    return " ".join(parts)


# -- prices -----------------------------------------------------------------------------------------------


def accelerator_of(gce_type: str) -> str:
    """The catalog's model name of a GCE accelerator type (``nvidia-tesla-t4`` -> ``T4``); unknown names come
    back upper-cased without the ``nvidia-`` prefix."""
    return _ACCELERATORS.get(gce_type, gce_type.removeprefix("nvidia-").removeprefix("tesla-").upper())


def _gce_accelerator_name(model: str) -> str:
    for name, m in _ACCELERATORS.items():
        if m == model:
            return name
    return "nvidia-" + model.lower()


def split_gpu_type(instance_type: str) -> tuple[str, str | None, int]:
    """``("n1-standard-4", "T4", 1)`` for ``n1-standard-4+T4:1``; ``(name, None, 0)`` for plain types."""
    m = _GPU_TYPE.match(instance_type)
    if not m:
        return instance_type, None, 0
    return m.group("host"), m.group("acc"), int(m.group("n"))


def _gpu_model(words: str) -> str:
    """``Tesla T4`` -> ``T4``, ``A100 80GB`` -> ``A100-80GB``, ``H100 80GB`` -> ``H100``."""
    w = words.strip().upper().replace("TESLA ", "")
    if w.startswith(("H100", "H200")):
        return w.split()[0].replace("MEGA", "").strip()
    return w.replace(" ", "-")


@dataclass(frozen=True, slots=True)
class BillingRates:
    """USD rates per region read from Billing Catalog SKUs: ``core[(region, family, capacity)]`` per vCPU
    hour, ``ram[...]`` per GiB hour, ``gpu[(region, model, capacity)]`` per GPU hour; ``rows`` SKUs used,
    ``skipped`` SKUs that are not per-family compute rates (commitments, licences, storage...)."""

    core: dict[tuple[str, str, Capacity], float]
    ram: dict[tuple[str, str, Capacity], float]
    gpu: dict[tuple[str, str, Capacity], float]
    rows: int = 0
    skipped: int = 0


def _unit_usd(sku: Mapping[str, Any]) -> tuple[float, str] | None:
    """(USD per usage unit, usage unit) of a SKU's current price (first tier of ``pricingInfo[0]``)."""
    try:
        expr = sku["pricingInfo"][0]["pricingExpression"]
        rates = expr["tieredRates"]
        price = rates[0]["unitPrice"]
    except (KeyError, IndexError, TypeError):
        return None
    if price.get("currencyCode", "USD") != "USD":
        return None
    usd = float(price.get("units") or 0) + float(price.get("nanos") or 0) / 1e9
    return usd, str(expr.get("usageUnit", ""))


def parse_billing_skus(skus: Iterable[Mapping[str, Any]]) -> BillingRates:
    """Per-family vCPU/RAM rates and per-model GPU rates from Billing Catalog ``skus`` of Compute Engine.

    Keeps SKUs with ``category.resourceFamily == "Compute"``, ``resourceGroup`` CPU/RAM/GPU (N1's
    ``N1Standard`` too), ``usageType`` ``OnDemand`` (on-demand) or ``Preemptible`` (spot), units ``h`` (cores,
    GPUs) or ``GiBy.h`` (RAM), and a description of the shape "<Family> [AMD|Intel|Arm] [Predefined]
    [Instance] Core|Ram running in <place>" or "Nvidia [Tesla] <model> GPU running in <place>". Sole-tenancy,
    custom, commitment and licence SKUs do not match and are counted in ``skipped``."""
    core: dict[tuple[str, str, Capacity], float] = {}
    ram: dict[tuple[str, str, Capacity], float] = {}
    gpu: dict[tuple[str, str, Capacity], float] = {}
    rows = skipped = 0
    for sku in skus:
        cat = sku.get("category") or {}
        usage = cat.get("usageType")
        capacity = {"OnDemand": Capacity.ON_DEMAND, "Preemptible": Capacity.SPOT}.get(str(usage))
        priced = _unit_usd(sku)
        if cat.get("resourceFamily") != "Compute" or capacity is None or priced is None:
            skipped += 1
            continue
        usd, unit = priced
        desc = _SPOT_PREFIX.sub("", str(sku.get("description", "")).strip())
        if re.search(r"sole tenancy|custom|extended|commitment|reserved|premium", desc, re.IGNORECASE):
            skipped += 1
            continue
        table: dict[tuple[str, str, Capacity], float]
        g = _GPU.match(desc)
        m = _CORE_RAM.match(desc)
        if g and unit == "h":
            table, what = gpu, _gpu_model(g.group("model"))
        elif m and m.group("kind") == "Core" and unit == "h":
            table, what = core, _family(m.group("fam"))
        elif m and m.group("kind") == "Ram" and unit == "GiBy.h":
            table, what = ram, _family(m.group("fam"))
        else:
            skipped += 1
            continue
        if not what or usd <= 0:
            skipped += 1
            continue
        rows += 1
        for region in sku.get("serviceRegions") or []:
            table[(str(region), what, capacity)] = usd
    return BillingRates(core, ram, gpu, rows, skipped)


def _family(words: str) -> str:
    w = words.strip().lower()
    if w in _FAMILY_WORDS:
        return _FAMILY_WORDS[w]
    return w if re.fullmatch(r"[a-z][a-z0-9]{0,4}", w) else ""


def price_machine_type(
    rates: BillingRates,
    region: str,
    shape: InstanceType,
    capacity: Capacity,
    *,
    extra_gpu: tuple[str, int] | None = None,
) -> float | None:
    """Hourly USD of ``shape`` (a GCE machine type, ``shape.name`` without any ``+GPU`` suffix) in
    ``region``: vCPUs x core rate + GiB x RAM rate of its family (+ bundled GPUs, + ``extra_gpu`` =
    (model, count) attached), or ``None`` when a rate is missing. ``shape.vcpus`` is the *billed* vCPUs."""
    family = shape.name.split("-")[0]
    c = rates.core.get((region, family, capacity))
    r = rates.ram.get((region, family, capacity))
    if c is None or r is None:
        return None
    usd = shape.vcpus * c + shape.memory_gib * r
    gpus = [(shape.accelerator, shape.gpus)] if shape.gpus and shape.accelerator else []
    if extra_gpu:
        gpus.append(extra_gpu)
    for model, n in gpus:
        g = rates.gpu.get((region, str(model), capacity))
        if g is None:
            return None
        usd += n * g
    return round(usd, 9)  # nanos: the Billing Catalog's own precision


def _to_instance_type(raw: Mapping[str, Any]) -> InstanceType:
    """A GCE ``machineType`` resource as an :class:`InstanceType` (billed vCPUs for shared-core types)."""
    name = str(raw["name"])
    accs = raw.get("accelerators") or []
    gpus = sum(int(a.get("guestAcceleratorCount", 0)) for a in accs)
    model = accelerator_of(str(accs[0].get("guestAcceleratorType", ""))) if accs else None
    family = name.split("-")[0]
    return InstanceType(
        name=name,
        vcpus=SHARED_CORE_VCPUS.get(name, float(raw.get("guestCpus", 0))),
        memory_gib=round(float(raw.get("memoryMb", 0)) / 1024.0, 3),
        gpus=gpus,
        accelerator=model,
        gpu_memory_gib=_GPU_MEMORY_GIB.get(model or "", 0.0) if gpus else 0.0,
        arch="arm64" if family in ("t2a", "c4a", "a4x") else "amd64",
    )


def _region_of_zone(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _last(link: str | None) -> str:
    return str(link or "").rstrip("/").rsplit("/", 1)[-1]


# -- libcloud wiring --------------------------------------------------------------------------------------


class _GoogleAuthToken:
    """What Libcloud's connection reads (``access_token``) from google-auth credentials, refreshed when
    expired (Application Default Credentials, workload identity federation, the metadata server)."""

    def __init__(self, credentials: Any) -> None:
        self.credentials = credentials
        self._lock = threading.Lock()

    @property
    def access_token(self) -> str:
        with self._lock:
            if not self.credentials.valid:
                from google.auth.transport.requests import Request

                self.credentials.refresh(Request())
            return str(self.credentials.token)


def _driver_class(endpoint: str | None, ca_bundle: str | None, poll_interval_seconds: float,
                  google_credentials: Any = None) -> type[Any]:
    """A GCE driver class whose connection goes to ``endpoint`` (host and port set on a connection subclass:
    Libcloud's ``host``/``port`` driver kwargs collide with GCEConnection's positional arguments) and trusts
    ``ca_bundle`` for that connection only (no global ``libcloud.security`` change)."""
    url = urlparse(endpoint) if endpoint else None
    attrs: dict[str, Any] = {"poll_interval": poll_interval_seconds, "hb_port": None, "hb_ca": ca_bundle,
                             "hb_google": google_credentials}
    if url is not None:
        attrs["host"] = url.hostname
        attrs["hb_port"] = url.port or (443 if url.scheme == "https" else 80)

    def __init__(self: Any, user_id: Any, key: Any, secure: bool = True, auth_type: Any = None,
                 credential_file: Any = None, project: Any = None, **kwargs: Any) -> None:
        if self.hb_google is None:
            GCEConnection.__init__(self, user_id, key, secure, auth_type=auth_type, credential_file=credential_file,
                                   project=project, **kwargs)
        else:  # google-auth credentials (ADC, workload identity): Libcloud's own OAuth2 flow is skipped
            kwargs.pop("scopes", None)
            super(GoogleBaseConnection, self).__init__(user_id, key, secure=secure, **kwargs)
            self.oauth2_credential = _GoogleAuthToken(self.hb_google)
            self.request_path = f"/compute/v1/projects/{project}"
            self.gce_params = None
        if self.hb_port:
            self.port = self.hb_port

    def connect(self: Any, *args: Any, **kwargs: Any) -> None:
        GCEConnection.connect(self, *args, **kwargs)
        if self.hb_ca:
            self.connection.ca_cert = self.hb_ca

    attrs.update({"__init__": __init__, "connect": connect})
    conn_cls = type("HbGCEConnection", (GCEConnection,), attrs)
    return type("HbGCENodeDriver", (GCENodeDriver,), {"connectionCls": conn_cls})


class GcpProvider:
    """Compute Engine instances in ``zones`` of ``project`` (see the module docstring for the contract).

    ``image`` is the boot image (a family URL is fine), ``network`` the VPC network name, ``disk_gb`` the
    boot disk size; ``poll_interval_seconds`` is how often GCE operations are polled.

    One object holds one Libcloud connection, which is not thread-safe: build one adapter per thread (it is
    cheap: the key file is read, the token comes from the cache)."""

    name = "gcp"
    capabilities = frozenset(
        {Capability.SPOT, Capability.GPUS, Capability.MULTI_NODE, Capability.TAGS, Capability.LIVE_PRICES,
         Capability.RUNS_WORK}
    )

    def __init__(
        self,
        project: str | None = None,
        *,
        zones: Iterable[str] = ("us-central1-a",),
        credentials_file: str | None = None,
        endpoint: str | None = None,
        billing_url: str = DEFAULT_BILLING_URL,
        ca_bundle: str | None = None,
        token_cache: str | None = None,
        image: str | None = None,
        network: str = "default",
        disk_gb: int = 20,
        poll_interval_seconds: float = 2.0,
        subnetwork: str | None = None,
        external_ip: bool = True,
        max_runtime_hours: float | None = None,
        credentials: Any = None,
        images: Mapping[str, str] | None = None,
    ) -> None:
        path = credentials_file or os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        key: dict[str, Any] = {}
        if path:
            try:
                key = json.loads(Path(path).read_text())
                if not isinstance(key, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as exc:
                raise AuthError(
                    f"gcp: cannot read {path} ({type(exc).__name__}: {exc}). To fix: point "
                    "GOOGLE_APPLICATION_CREDENTIALS at a service-account key or an ADC/workload identity file.",
                    provider="gcp",
                ) from exc
        email = "adc"
        if credentials is None and key.get("type", "service_account") == "service_account" and path:
            try:
                email = str(key["client_email"])
                if "private_key" not in key:
                    raise KeyError("private_key")
            except (KeyError, TypeError) as exc:
                raise AuthError(
                    f"gcp: cannot use {path} as a service-account key ({type(exc).__name__}: {exc}). To fix: "
                    "download a JSON key of a service account from IAM and point GOOGLE_APPLICATION_CREDENTIALS at "
                    "it.",
                    provider="gcp",
                ) from exc
        elif credentials is None:  # ADC: gcloud login, workload identity federation, GKE/GCE metadata server
            known = project or os.environ.get("GOOGLE_CLOUD_PROJECT")
            credentials, adc_project = _default_credentials(path, find_project=not known)
            adc_project = adc_project or getattr(credentials, "quota_project_id", None)
            key = {"project_id": adc_project} if adc_project else {}
        proj = project or os.environ.get("GOOGLE_CLOUD_PROJECT") or key.get("project_id")
        if not proj:
            raise AuthError("gcp: no project. To fix: set GOOGLE_CLOUD_PROJECT.", provider="gcp")
        self.google_credentials = credentials
        self.project = str(proj)
        self.zones = list(zones)
        if not self.zones:
            raise InvalidRequestError("gcp: no zone configured. To fix: set BROKER_GCP_ZONES.", provider="gcp")
        self.credentials_file = path
        self.service_account = email
        self.endpoint = endpoint
        self.billing_url = billing_url.rstrip("/")
        self.ca_bundle = ca_bundle
        self.token_cache = token_cache
        self.image = image  # one image for every instance; else by arch/GPU (images, providers/images.py)
        self.images = dict(images or {})
        self.network = network
        self.disk_gb = disk_gb
        self.subnetwork = subnetwork
        self.external_ip = external_ip
        self.max_runtime_hours = max_runtime_hours
        self._reports: dict[str, Report] = {}  # instance id -> what its serial console reported
        self.poll_interval_seconds = poll_interval_seconds
        self._driver_cls = _driver_class(endpoint, ca_bundle, poll_interval_seconds, credentials)
        self._drv: Any = None
        self._lock = threading.Lock()
        self._errors: list[ProviderError] = []
        self._ended: set[str] = set()  # ids we terminated, or whose preemption was already reported
        self.last_provenance: list[Provenance] = []

    # -- clients ----------------------------------------------------------------------------------------

    def _driver(self) -> Any:
        with self._lock:
            if self._drv is None:
                with map_errors(self.name):
                    self._drv = self._driver_cls(
                        self.service_account, self.credentials_file or "", project=self.project,
                        auth_type="SA", scopes=SCOPES, credential_file=self.token_cache,
                    )
            return self._drv

    def _pages(self, path: str, params: Mapping[str, str] | None = None) -> Iterator[dict[str, Any]]:
        """Every page of a Compute API list call (``pageToken`` / ``nextPageToken``)."""
        drv = self._driver()
        token: str | None = None
        for _ in range(10_000):
            p = dict(params or {}) | {"maxResults": "500"}
            if token:
                p["pageToken"] = token
            body = drv.connection.request(path, method="GET", params=p).object
            yield body
            token = body.get("nextPageToken") or None
            if not token:
                return

    def _zones_of(self, region: str) -> list[str]:
        """Configured zones of ``region``; else every zone GCE lists for it (``GET /zones``, cached)."""
        mine = [z for z in self.zones if _region_of_zone(z) == region]
        if mine:
            return mine
        drv = self._driver()
        return sorted(z.name for z in drv.zone_dict.values() if _last(z.extra.get("region")) == region)

    # -- offers -----------------------------------------------------------------------------------------------

    def _billing_skus(self) -> list[dict[str, Any]]:
        url = f"{self.billing_url}/v1/services/{COMPUTE_SERVICE_ID}/skus"
        drv = self._driver()
        with map_errors(self.name):
            token = drv.connection.oauth2_credential.access_token  # refreshed by Libcloud when expired
        verify: Any = self.ca_bundle or True
        skus: list[dict[str, Any]] = []
        with map_errors(self.name), httpx.Client(timeout=60.0, verify=verify,
                                                 headers={"Authorization": f"Bearer {token}"}) as http:
            params = {"currencyCode": "USD", "pageSize": "5000"}
            for _ in range(10_000):
                resp = http.get(url, params=params)
                resp.raise_for_status()
                body = resp.json()
                skus.extend(body.get("skus") or [])
                nxt = body.get("nextPageToken")
                if not nxt:
                    break
                params = params | {"pageToken": nxt}
        return skus

    def offers(self) -> list[Offer]:
        """On-demand and spot offers of every machine type the configured zones sell and the Billing
        Catalog prices, one per (type, region, capacity); N1 types also with each attachable GPU."""
        self.last_provenance = []
        skus = self._billing_skus()
        rates = parse_billing_skus(skus)
        shapes: dict[str, dict[str, InstanceType]] = {}  # region -> name -> shape
        gpus: dict[str, dict[str, int]] = {}  # region -> attachable model -> max cards
        for zone in self.zones:
            region = _region_of_zone(zone)
            with map_errors(self.name, region):
                for page in self._pages(f"/zones/{zone}/machineTypes"):
                    for raw in page.get("items") or []:
                        if raw.get("deprecated"):
                            continue
                        shapes.setdefault(region, {})[raw["name"]] = _to_instance_type(raw)
                for page in self._pages(f"/zones/{zone}/acceleratorTypes"):
                    for acc in page.get("items") or []:
                        model = accelerator_of(str(acc.get("name", "")))
                        have = gpus.setdefault(region, {})
                        have[model] = max(have.get(model, 0), int(acc.get("maximumCardsPerInstance", 0)))
        out: list[Offer] = []
        dropped = 0
        for region in sorted(shapes):
            loc = Location("gcp", region, None, continent=_continent(region))
            for name in sorted(shapes[region]):
                shape = shapes[region][name]
                for cap in (Capacity.ON_DEMAND, Capacity.SPOT):
                    usd = price_machine_type(rates, region, shape, cap)
                    if usd is None:
                        dropped += cap is Capacity.ON_DEMAND
                        continue
                    out.append(Offer(shape, loc, cap, usd, "gcp-billing-catalog"))
                    if name.startswith("n1-"):
                        out.extend(self._attached(rates, region, loc, shape, cap, gpus.get(region, {})))
        self.last_provenance.append(
            Provenance(source=f"gcp:{self.billing_url}", date=datetime.now(UTC).date().isoformat(),
                       rows=rates.rows, offers=len(out), dropped=dropped, provider="gcp")
        )
        return out

    @staticmethod
    def _attached(rates: BillingRates, region: str, loc: Location, shape: InstanceType, cap: Capacity,
                  models: Mapping[str, int]) -> list[Offer]:
        out = []
        for model, max_cards in sorted(models.items()):
            for n, (max_cpu, max_mem) in sorted(N1_GPU_LIMITS.get(model, {}).items()):
                if n > max_cards or shape.vcpus > max_cpu or shape.memory_gib > max_mem:
                    continue
                usd = price_machine_type(rates, region, shape, cap, extra_gpu=(model, n))
                if usd is None:
                    continue
                it = InstanceType(f"{shape.name}+{model}:{n}", shape.vcpus, shape.memory_gib, gpus=n,
                                  accelerator=model, gpu_memory_gib=_GPU_MEMORY_GIB.get(model, 0.0))
                out.append(Offer(it, loc, cap, usd, "gcp-billing-catalog"))
        return out

    # -- lifecycle ----------------------------------------------------------------------------------------

    def _to_instance(self, raw: Mapping[str, Any]) -> Instance:
        """A GCE ``instance`` resource as an :class:`Instance` (tags from metadata ``hb-tags``, else labels)."""
        zone = _last(raw.get("zone"))
        tags: dict[str, str] = dict(raw.get("labels") or {})
        for item in (raw.get("metadata") or {}).get("items") or []:
            if item.get("key") == TAGS_METADATA_KEY:
                try:
                    tags = {str(k): str(v) for k, v in json.loads(item.get("value") or "{}").items()}
                except (ValueError, AttributeError):
                    pass
        created = raw.get("creationTimestamp")
        try:
            launched_at = datetime.fromisoformat(str(created)) if created else None
        except ValueError:
            launched_at = None
        machine = _last(raw.get("machineType"))
        accs = raw.get("guestAccelerators") or []
        if accs:
            a = accs[0]
            machine += f"+{accelerator_of(_last(a.get('acceleratorType')))}:{int(a.get('acceleratorCount', 0))}"
        return Instance(
            id=f"{zone}/{raw['name']}",
            provider="gcp",
            region=_region_of_zone(zone),
            instance_type=machine,
            state=_STATE.get(str(raw.get("status", "")), InstanceState.UNKNOWN),
            zone=zone,
            tags=tags,
            launched_at=launched_at,
        )

    def _list_raw(self, tags: Mapping[str, str] | None, request_id: str | None = None) -> list[dict[str, Any]]:
        """Our instances (label ``hb-request`` set) whose labels match ``tags``, across all zones
        (``GET /aggregated/instances?filter=...``, paged). Libcloud's ``list_nodes`` takes no filter and
        looks up every boot disk, so the driver's connection is used directly."""
        out: list[dict[str, Any]] = []
        with map_errors(self.name, None, request_id):
            for page in self._pages("/aggregated/instances", {"filter": _label_filter(tags)}):
                for scoped in (page.get("items") or {}).values():
                    out.extend(scoped.get("instances") or [])
        return out

    def instance_body(self, offer: Offer, zone: str, name: str, tags: Mapping[str, str],
                      job: JobSpec | None = None) -> dict[str, Any]:
        """The ``instances.insert`` body: machine type, one auto-delete boot disk, one NIC (``network`` or
        ``subnetwork``, an ephemeral external IP unless ``external_ip`` is off), labels, the original tags
        and, for a job with a command, the ``startup-script`` that runs it (:mod:`providers.bootstrap`) and a
        ``maxRunDuration`` just past its runtime limit. Spot capacity is a Spot VM (``provisioningModel
        SPOT``, stopped on preemption so the broker sees it and deletes it), not a legacy preemptible VM."""
        host, model, n = split_gpu_type(offer.instance_type.name)
        items = [{"key": TAGS_METADATA_KEY, "value": json.dumps(dict(tags), sort_keys=True)}]
        image = self.image or str(pick("gcp", offer.instance_type, GCP_IMAGES, self.images, region=offer.region))
        if offer.instance_type.gpus and "deeplearning-platform-release" in image:
            items.append({"key": "install-nvidia-driver", "value": "True"})  # DLVM installs it at first boot
        scheduling: dict[str, Any] = {"provisioningModel": "STANDARD", "automaticRestart": True,
                                      "onHostMaintenance": "MIGRATE"}
        if offer.capacity is Capacity.SPOT:
            scheduling = {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP",
                          "automaticRestart": False, "onHostMaintenance": "TERMINATE"}
        if model or offer.instance_type.gpus:
            scheduling["onHostMaintenance"] = "TERMINATE"  # GPUs cannot live-migrate
        if job is not None and job.command:
            limit = runtime_limit_seconds(job, self.max_runtime_hours)
            items.append({"key": STARTUP_SCRIPT_KEY, "value": script_for(
                job, "gcp", max_bytes=METADATA_VALUE_MAX_BYTES, spot=offer.capacity is Capacity.SPOT,
                max_runtime_hours=self.max_runtime_hours)})
            scheduling |= {"maxRunDuration": {"seconds": str(limit + 900)}, "instanceTerminationAction": "STOP"}
        nic: dict[str, Any] = ({"subnetwork": self.subnetwork} if self.subnetwork
                               else {"network": f"global/networks/{self.network}"})
        if self.external_ip:
            nic["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
        body: dict[str, Any] = {
            "name": name,
            "machineType": f"zones/{zone}/machineTypes/{host}",
            "labels": gce_labels(tags),
            "metadata": {"items": items},
            "disks": [{"autoDelete": True, "boot": True, "type": "PERSISTENT", "mode": "READ_WRITE",
                       "deviceName": name,
                       "initializeParams": {"diskName": name, "diskSizeGb": str(self.disk_gb),
                                            "diskType": f"zones/{zone}/diskTypes/pd-balanced",
                                            "sourceImage": image, "labels": gce_labels(tags)}}],
            "networkInterfaces": [nic],
            "scheduling": scheduling,
        }
        if model:
            body["guestAccelerators"] = [{"acceleratorType": f"zones/{zone}/acceleratorTypes/"
                                          f"{_gce_accelerator_name(model)}", "acceleratorCount": n}]
        return body

    def _create_one(self, drv: Any, offer: Offer, zone: str, name: str, tags: Mapping[str, str],
                    job: JobSpec | None = None) -> Any:
        """``POST /zones/{zone}/instances`` through Libcloud's connection (which waits for the operation and
        raises its error); Libcloud's own ``create_node`` cannot ask for Spot VMs nor ``maxRunDuration``."""
        try:
            drv.connection.async_request(f"/zones/{zone}/instances", method="POST",
                                         data=self.instance_body(offer, zone, name, tags, job))
        except ResourceExistsError:  # created by an earlier try of this request: adopt it
            pass
        return drv.ex_get_node(name, zone)

    def launch(
        self,
        offer: Offer,
        count: int,
        request_id: str,
        *,
        tags: Mapping[str, str],
        job: JobSpec | None = None,
    ) -> list[Instance]:
        """Create ``count`` instances of ``offer`` (idempotent per ``request_id``; see the module docstring
        for zone choice). Raises the typed error of the last zone tried."""
        require_count("gcp", offer, count, request_id)
        all_tags = launch_tags(tags, request_id)
        digest = hashlib.sha256(request_id.encode()).hexdigest()[:10]
        names = [f"hb-{digest}-{n}" for n in range(count)]
        have = {r["name"]: r for r in self._list_raw({TAG_REQUEST: request_id}, request_id)
                if (i := self._to_instance(r)).tags.get(TAG_REQUEST) == request_id
                and i.state is not InstanceState.TERMINATED}
        pinned = sorted({_last(r.get("zone")) for r in have.values()})
        zones = pinned[:1] or ([offer.location.zone] if offer.location.zone else self._zones_of(offer.region))
        if not zones:
            raise InvalidRequestError(
                f"gcp: no zone of region {offer.region} is known. To fix: add one to BROKER_GCP_ZONES.",
                provider="gcp", region=offer.region, request_id=request_id,
            )
        drv = self._driver()
        with map_errors(self.name, offer.region, request_id):
            known = drv.zone_dict
        unknown = [z for z in zones if z not in known]
        if unknown:
            raise InvalidRequestError(
                f"gcp: zone(s) {', '.join(unknown)} do not exist in project {self.project}. To fix: use zones "
                "`GET /zones` lists (BROKER_GCP_ZONES).",
                provider="gcp", region=offer.region, request_id=request_id,
            )
        last: ProviderError | None = None
        for zone in zones:
            made: list[Instance] = []
            try:
                with map_errors(self.name, offer.region, request_id):
                    for name in names:
                        if name in have:
                            made.append(self._to_instance(have[name]))
                            continue
                        node = self._create_one(drv, offer, zone, name, all_tags, job)
                        made.append(replace(self._node_instance(node), instance_type=offer.instance_type.name))
                return made
            except (CapacityError, InvalidRequestError) as exc:
                # Next zone only while nothing of this request exists (a gang stays in one zone).
                if have or made or pinned:
                    raise
                self._clear_zone(request_id, zone)  # an insert that failed late may have left an instance
                last = exc
        assert last is not None
        raise last

    def _clear_zone(self, request_id: str, zone: str) -> None:
        """Best effort: delete what exists of ``request_id`` in ``zone`` before launching in another zone."""
        try:
            ids = [i.id for i in self.instances({TAG_REQUEST: request_id}) if i.zone == zone]
            self.terminate(ids, request_id)
        except ProviderError:
            return

    def _node_instance(self, node: Any) -> Instance:
        """A Libcloud ``Node`` as an :class:`Instance` (Libcloud drops ``guestAccelerators``: callers that
        know the offer set ``instance_type``)."""
        extra = node.extra or {}
        raw = {"name": node.name, "zone": getattr(extra.get("zone"), "name", ""), "status": extra.get("status"),
               "machineType": extra.get("machineType"), "labels": extra.get("labels"),
               "metadata": extra.get("metadata"), "creationTimestamp": extra.get("creationTimestamp")}
        return self._to_instance(raw)

    def instances(self, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """Our instances whose (original) tags include ``tags``. One that stopped without us deleting it is
        ``succeeded``/``failed`` with the exit code and log tail its serial console shows (one
        ``getSerialPortOutput`` per ended instance, cached); a Spot VM stopped without that report was
        preempted: a ``CapacityError`` for it is queued for :meth:`poll_errors`."""
        out: list[Instance] = []
        for raw in self._list_raw(tags):
            inst = self._to_instance(raw)
            if not matches_tags(inst.tags, tags):
                continue
            sched = raw.get("scheduling") or {}
            spot = bool(sched.get("preemptible")) or sched.get("provisioningModel") == "SPOT"
            if inst.state is InstanceState.TERMINATED:
                report = self._report(raw, inst)
                if report.exit_code is not None and not report.preempted:
                    inst = replace(inst, state=InstanceState.SUCCEEDED if report.exit_code == 0
                                   else InstanceState.FAILED, exit_code=report.exit_code, log_tail=report.log_tail)
                elif spot or report.preempted:
                    self._preempted(inst)
            out.append(inst)
        return out

    def _report(self, raw: Mapping[str, Any], inst: Instance) -> Report:
        """What the serial console of a stopped instance we did not delete reports (cached per id)."""
        with self._lock:
            if inst.id in self._reports:
                return self._reports[inst.id]
            if inst.id in self._ended:
                return Report(None)
        zone, _, name = inst.id.rpartition("/")
        drv = self._driver()
        with map_errors(self.name, inst.region):
            try:
                body = drv.connection.request(f"/zones/{zone}/instances/{name}/serialPort", method="GET",
                                              params={"port": "1"}).object
            except ResourceNotFoundError:
                return Report(None)
        report = parse_report(str((body or {}).get("contents") or ""))
        with self._lock:
            self._reports[inst.id] = report
        return report

    def _preempted(self, inst: Instance) -> None:
        with self._lock:
            if inst.id not in self._ended:  # reported once
                self._ended.add(inst.id)
                self._errors.append(reclaimed_error(inst, "was preempted", "preempted"))

    def terminate(self, ids: Sequence[str], request_id: str) -> None:
        """Delete instances ``<zone>/<name>`` (and their auto-delete boot disks); unknown ids are ignored."""
        if not ids:
            return
        drv = self._driver()
        for ident in ids:
            zone, _, name = ident.rpartition("/")
            if not zone or not name:
                continue
            with self._lock:
                self._ended.add(ident)
            with map_errors(self.name, _region_of_zone(zone), request_id):
                if zone not in drv.zone_dict:
                    continue
                try:
                    node = drv.ex_get_node(name, zone)
                    drv.destroy_node(node)
                except ResourceNotFoundError:
                    continue

    def orphans(self, active_jobs: set[str]) -> list[Any]:
        """Boot disks labelled ``hb-request`` that no instance uses and whose job is not active (a VM deleted
        without its disk, a disk whose instance insert failed)."""
        from .sweeper import Orphan

        active = {gce_label(j) for j in active_jobs}
        out = []
        with map_errors(self.name):
            for page in self._pages("/aggregated/disks", {"filter": f"(labels.{TAG_REQUEST}:*)"}):
                for scoped in (page.get("items") or {}).values():
                    for d in scoped.get("disks") or []:
                        labels = d.get("labels") or {}
                        if d.get("users") or TAG_REQUEST not in labels or labels.get(TAG_JOB) in active:
                            continue
                        out.append(Orphan("gcp", "disk", f"{_last(d.get('zone'))}/{d['name']}",
                                          labels.get(TAG_JOB, ""), labels.get(TAG_REQUEST, "")))
        return out

    def delete_orphans(self, items: Sequence[Any]) -> None:
        drv = self._driver()
        for o in items:
            zone, _, name = str(o.id).rpartition("/")
            with map_errors(self.name, _region_of_zone(zone)):
                try:
                    drv.connection.async_request(f"/zones/{zone}/disks/{name}", method="DELETE")
                except ResourceNotFoundError:
                    continue

    def poll_errors(self) -> list[ProviderError]:
        with self._lock:
            out, self._errors = self._errors, []
            return out


def _default_credentials(path: str | None, *, find_project: bool = True) -> tuple[Any, str | None]:
    """google-auth credentials and project from ``path`` (an ADC file that is not a service-account key:
    ``authorized_user``, ``external_account`` for workload identity federation, ``impersonated_service_account``)
    or from Application Default Credentials (gcloud's ADC file, the GKE/GCE metadata server).

    ``find_project=False`` when the caller knows the project. Design choice: google-auth's loader looks an
    ``external_account``'s project up at once (an STS exchange plus a Resource Manager call, at construction);
    when the project is known, the credentials are built from the file without that, and the token exchange
    happens at the first API call."""
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
    except ImportError as exc:
        raise AuthError("gcp: Application Default Credentials need google-auth. To fix: pip install "
                        "'hybrid-broker[gcp]' (or use a service-account key).", provider="gcp") from exc
    try:
        if path and not find_project:
            loaded = json.loads(Path(path).read_text())
            if isinstance(loaded, dict) and loaded.get("type") == "external_account":
                return _external_account(loaded), None
        if path:
            return google.auth.load_credentials_from_file(path, scopes=SCOPES)
        return google.auth.default(scopes=SCOPES)
    except (DefaultCredentialsError, ValueError, KeyError) as exc:  # from_info: ValueError on a bad config
        raise AuthError(
            f"gcp: no usable credentials ({exc}). To fix: set GOOGLE_APPLICATION_CREDENTIALS to a service-account "
            "key or a workload identity configuration, run `gcloud auth application-default login`, or run on "
            "GCE/GKE with a service account.",
            provider="gcp",
        ) from exc


def _external_account(info: Mapping[str, Any]) -> Any:
    """Workload identity federation credentials of an ``external_account`` file, as google-auth builds them
    (AWS, executable-sourced or file/URL-sourced subject tokens), scoped to :data:`SCOPES`."""
    from google.auth import aws, identity_pool, pluggable

    source = info.get("credential_source") or {}
    if info.get("subject_token_type") == "urn:ietf:params:aws:token-type:aws4_request":
        return aws.Credentials.from_info(info, scopes=SCOPES)
    if isinstance(source, Mapping) and source.get("executable") is not None:
        return pluggable.Credentials.from_info(info, scopes=SCOPES)
    return identity_pool.Credentials.from_info(info, scopes=SCOPES)


def _continent(region: str) -> str:
    try:
        from pricing.geo import continent_of
    except ImportError:  # pricing is optional for the adapter
        return ""
    return continent_of("gcp", region)
