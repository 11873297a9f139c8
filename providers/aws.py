"""AWS EC2: Libcloud's EC2 driver for the instance lifecycle, boto3 for what Libcloud lacks.

* offers: ``describe_instance_type_offerings`` (what a region sells), ``describe_instance_types`` (shapes,
  GPUs, architecture), on-demand prices from the AWS Price List **bulk offer file** (JSON, from a URL or a
  file; ``price_list_url`` may contain ``{region}``), spot prices from ``describe_spot_price_history``
  (cheapest zone). Spot prices below 5 % or above 100 % of on-demand are dropped as outliers (moto, for one,
  reports a constant 0.00001).
* lifecycle: ``create_node``/``list_nodes``/``destroy_node`` of Libcloud's EC2 driver, tags as EC2 tags,
  ``ClientToken`` plus a by-tag lookup for idempotency per request id.
* job completion: a launch for a job with a command passes EC2 user data (:func:`completion_script`) that runs
  the command, prints ``HB-EXIT-CODE=<n>`` on the serial console and powers the VM off, with instance-initiated
  shutdown behaviour ``terminate``. :meth:`AwsProvider.instances` reads the console (``GetConsoleOutput``) of
  an ended instance the broker did not terminate itself and reports ``succeeded``/``failed`` with the exit code
  (:func:`parse_exit_code`); results are cached per instance id, so each ended instance costs one call.

When ``endpoint_url`` is given (moto, LocalStack), the driver signs with SigV4 and a small shim fixes the
EC2 XML namespace those emulators emit without its trailing slash (RECIPES §2.3).
"""

from __future__ import annotations

import base64
import dataclasses
import re
import shlex
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

import boto3
import httpx
from libcloud.compute.base import Node, NodeImage, NodeSize
from libcloud.compute.drivers.ec2 import EC2Connection, EC2NodeDriver, EC2Response

from broker.errors import CatalogError, InvalidRequestError, ProviderError
from broker.model import (
    Capacity,
    Instance,
    InstanceState,
    InstanceType,
    JobSpec,
    Location,
    Offer,
    Provenance,
)

from .base import TAG_REQUEST, Capability, launch_tags, matches_tags
from .errors import map_errors

__all__ = [
    "AwsProvider",
    "parse_price_list",
    "completion_script",
    "parse_exit_code",
    "DEFAULT_PRICE_LIST_URL",
    "CONTINENT",
    "EXIT_CODE_MARKER",
    "CONSOLES",
    "USER_DATA_MAX_BYTES",
]

DEFAULT_PRICE_LIST_URL = (
    "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
)
SPOT_OUTLIER_LOW = 0.05
_NS_BAD = 'xmlns="http://ec2.amazonaws.com/doc/2016-11-15"'
_NS_GOOD = 'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'
CONTINENT = {"us": "na", "ca": "na", "sa": "sa", "eu": "eu", "ap": "as", "me": "me", "af": "af", "il": "me"}
_ARCH = {"x86_64": "amd64", "arm64": "arm64"}
EXIT_CODE_MARKER = "HB-EXIT-CODE="
CONSOLES = ("/dev/ttyS0", "/dev/console")
USER_DATA_MAX_BYTES = 16 * 1024  # EC2's limit on user data before base64
_EXIT_RE = re.compile(r"^" + re.escape(EXIT_CODE_MARKER) + r"(\d{1,3})\r?$", re.MULTILINE)
_ENDED = ("shutting-down", "stopped", "terminated")
_FINAL = ("stopped", "terminated")  # console output will not change any more


class _ShimResponse(EC2Response):
    def parse_body(self) -> Any:
        if isinstance(self.body, str):
            self.body = self.body.replace(_NS_BAD, _NS_GOOD)
        return super().parse_body()


class _ShimConnection(EC2Connection):
    responseCls = _ShimResponse


class _ShimDriver(EC2NodeDriver):
    connectionCls = _ShimConnection


def parse_price_list(doc: Mapping[str, Any], region: str) -> dict[str, float]:
    """On-demand Linux USD/hour per instance type for ``region`` from an AWS bulk offer file (``AmazonEC2``).

    Keeps products with ``productFamily`` *Compute Instance*, ``operatingSystem`` Linux, ``tenancy`` Shared,
    ``preInstalledSw`` NA and ``capacitystatus`` Used (when present); prices are the ``Hrs`` dimension."""
    products = doc.get("products")
    terms = (doc.get("terms") or {}).get("OnDemand")
    if not isinstance(products, dict) or not isinstance(terms, dict):
        raise CatalogError(
            "the AWS price list has no products/terms.OnDemand. To fix: point price_list_url at an AmazonEC2 "
            "bulk offer file (offers/v1.0/aws/AmazonEC2/current/<region>/index.json)."
        )
    out: dict[str, float] = {}
    for sku, product in products.items():
        attrs = product.get("attributes") or {}
        if product.get("productFamily") not in ("Compute Instance", "Compute Instance (bare metal)"):
            continue
        if attrs.get("regionCode", region) != region:
            continue
        if (attrs.get("operatingSystem"), attrs.get("tenancy"), attrs.get("preInstalledSw", "NA")) != (
            "Linux", "Shared", "NA"
        ):
            continue
        if attrs.get("capacitystatus", "Used") != "Used":
            continue
        itype = attrs.get("instanceType")
        for term in (terms.get(sku) or {}).values():
            for dim in (term.get("priceDimensions") or {}).values():
                if dim.get("unit") != "Hrs":
                    continue
                try:
                    usd = float(dim["pricePerUnit"]["USD"])
                except (KeyError, TypeError, ValueError):
                    continue
                if itype and usd > 0:
                    out[itype] = min(usd, out.get(itype, usd))
    return out


def completion_script(
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    *,
    consoles: Sequence[str] = CONSOLES,
    poweroff: str = "poweroff",
) -> str:
    """The POSIX ``sh`` script passed as EC2 user data for a job: it runs ``command`` (argv, each word quoted)
    with ``env`` added to the environment in ``workdir`` (created when missing; a fresh ``mktemp -d`` directory
    when ``None``), then writes one line ``HB-EXIT-CODE=<n>`` to each of ``consoles`` (errors ignored) and runs
    ``poweroff`` last. ``poweroff`` is a shell command taken as is (tests pass a harmless one); everything
    else is quoted. If the working directory cannot be entered the command does not run and ``n`` is 125.

    Raises :class:`InvalidRequestError` for an empty command, an env name that is empty or holds ``=``, a NUL
    byte anywhere, or a script over EC2's 16 KiB user-data limit."""
    env = dict(env or {})
    words = list(command)
    if not words:
        raise InvalidRequestError("aws: the job has no command to run. To fix: give the job a command.",
                                  provider="aws")
    bad = [k for k in env if not k or "=" in k]
    if bad:
        raise InvalidRequestError(f"aws: env names {bad!r} cannot be set (empty or containing '='). "
                                  "To fix: rename those environment variables.", provider="aws")
    if any("\0" in x for x in [*words, *env, *env.values(), workdir or ""]):
        raise InvalidRequestError("aws: the job's command, env or workdir holds a NUL byte. To fix: remove it.",
                                  provider="aws")
    run = " ".join(shlex.quote(w) for w in words)
    if env:
        assigns = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
        run = f"env {assigns} {run}"
    wd = shlex.quote(workdir) if workdir else '"$(mktemp -d /tmp/hb-job.XXXXXX)"'
    lines = [
        "#!/bin/sh",
        "# hybrid-broker job runner (generated): run the job, report its exit code on the console, power off.",
        f"hb_wd={wd}",
        'if [ -n "$hb_wd" ] && mkdir -p "$hb_wd" && cd "$hb_wd"; then',
        f"  {run}",
        "  hb_rc=$?",
        "else",
        "  hb_rc=125",
        "fi",
        f"for hb_tty in {' '.join(shlex.quote(c) for c in consoles)}; do",
        f'  {{ printf \'%s%s\\n\' {shlex.quote(EXIT_CODE_MARKER)} "$hb_rc" > "$hb_tty"; }} 2>/dev/null || :',
        "done",
        poweroff,
        "",
    ]
    script = "\n".join(lines)
    size = len(script.encode())
    if size > USER_DATA_MAX_BYTES:
        raise InvalidRequestError(
            f"aws: the job's start-up script is {size} bytes, over EC2's {USER_DATA_MAX_BYTES}-byte user-data "
            "limit. To fix: shorten the command/env (e.g. put them in a script inside the image).",
            provider="aws",
        )
    return script


def parse_exit_code(console: str) -> int | None:
    """The exit code of the last ``HB-EXIT-CODE=<n>`` line (0..255) in a console text, else ``None``."""
    found = [int(m) for m in _EXIT_RE.findall(console) if int(m) <= 255]
    return found[-1] if found else None


def _to_instance_type(raw: Mapping[str, Any]) -> InstanceType:
    gpu = (raw.get("GpuInfo") or {}).get("Gpus") or []
    gpus = sum(int(g.get("Count", 0)) for g in gpu)
    arches = (raw.get("ProcessorInfo") or {}).get("SupportedArchitectures") or ["x86_64"]
    net = (raw.get("NetworkInfo") or {}).get("NetworkPerformance", "")
    gbps = None
    for word in str(net).replace("Up to", "").split():
        try:
            gbps = float(word)
            break
        except ValueError:
            continue
    return InstanceType(
        name=raw["InstanceType"],
        vcpus=float(raw["VCpuInfo"]["DefaultVCpus"]),
        memory_gib=round(raw["MemoryInfo"]["SizeInMiB"] / 1024.0, 3),
        gpus=gpus,
        accelerator=gpu[0].get("Name") if gpu else None,
        gpu_memory_gib=round(((gpu[0].get("MemoryInfo") or {}).get("SizeInMiB", 0)) / 1024.0, 3) if gpu else 0.0,
        arch=_ARCH.get(arches[0], arches[0]),
        network_gbps=gbps,
    )


def _state(node: Node) -> InstanceState:
    status = str((node.extra or {}).get("status") or node.state).lower()
    return {
        "pending": InstanceState.PENDING,
        "running": InstanceState.RUNNING,
        "shutting-down": InstanceState.TERMINATED,
        "terminated": InstanceState.TERMINATED,
    }.get(status, InstanceState.UNKNOWN)


class AwsProvider:
    """AWS EC2 over ``regions`` (see the module docstring). Credentials: explicit keys, else boto3's chain
    (env, profile, role); Libcloud gets the same resolved keys."""

    name = "aws"
    capabilities = frozenset(
        {Capability.SPOT, Capability.GPUS, Capability.MULTI_NODE, Capability.TAGS, Capability.LIVE_PRICES}
    )

    def __init__(
        self,
        regions: Iterable[str] = ("us-east-1",),
        *,
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        price_list_url: str | None = None,
        image_id: str | None = None,
        spot: bool = True,
    ) -> None:
        self.regions = list(regions)
        self.endpoint_url = endpoint_url
        self.price_list_url = price_list_url or DEFAULT_PRICE_LIST_URL
        self.image_id = image_id
        self.spot = spot
        self._session = boto3.Session(
            aws_access_key_id=access_key, aws_secret_access_key=secret_key, aws_session_token=session_token
        )
        self._drivers: dict[str, EC2NodeDriver] = {}
        self._images: dict[tuple[str, str], str] = {}
        self._exit_codes: dict[str, int | None] = {}  # instance id -> exit code read from its console
        self._terminated: set[str] = set()  # ids this adapter terminated: their end is not the job's
        self._lock = threading.Lock()
        self._errors: list[ProviderError] = []
        self.last_provenance: list[Provenance] = []

    # -- clients ----------------------------------------------------------------------------------------

    def _ec2(self, region: str) -> Any:
        return self._session.client("ec2", region_name=region, endpoint_url=self.endpoint_url)

    def _driver(self, region: str) -> EC2NodeDriver:
        with self._lock:
            drv = self._drivers.get(region)
            if drv is not None:
                return drv
            creds = self._session.get_credentials()
            if creds is None:
                from broker.errors import AuthError

                raise AuthError(
                    "aws: no credentials. To fix: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE.",
                    provider="aws", region=region,
                )
            frozen = creds.get_frozen_credentials()
            kwargs: dict[str, Any] = {"region": region, "signature_version": "4"}
            if frozen.token:
                kwargs["token"] = frozen.token
            if self.endpoint_url:
                url = urlparse(self.endpoint_url)
                drv = _ShimDriver(
                    frozen.access_key, frozen.secret_key, host=url.hostname, port=url.port,
                    secure=url.scheme == "https", **kwargs,
                )
            else:
                drv = EC2NodeDriver(frozen.access_key, frozen.secret_key, **kwargs)
            self._drivers[region] = drv
            return drv

    # -- offers ---------------------------------------------------------------------------------------------

    def _price_list(self, region: str) -> tuple[dict[str, float], str]:
        # The bulk file is hundreds of MB: streamed to a temporary file, then parsed incrementally (issue 12).
        import tempfile

        from pricing.aws_bulk import download_to, stream_price_list

        src = self.price_list_url.format(region=region)
        with map_errors(self.name, region):
            if not src.startswith(("http://", "https://")):
                return stream_price_list(src, region)
            with tempfile.NamedTemporaryFile(prefix="hb-aws-prices-", suffix=".json") as tmp:
                with httpx.stream("GET", src, timeout=120.0, follow_redirects=True) as resp:
                    resp.raise_for_status()
                    download_to(resp.iter_bytes(), tmp)
                tmp.flush()
                return stream_price_list(tmp.name, region)

    def offers(self) -> list[Offer]:
        """On-demand (and spot, when ``spot``) offers of every priced type each region sells."""
        out: list[Offer] = []
        self.last_provenance = []
        for region in self.regions:
            out.extend(self._region_offers(region))
        return out

    def _region_offers(self, region: str) -> list[Offer]:
        prices, published = self._price_list(region)
        ec2 = self._ec2(region)
        with map_errors(self.name, region):
            sold: set[str] = set()
            for page in ec2.get_paginator("describe_instance_type_offerings").paginate(
                LocationType="region", Filters=[{"Name": "location", "Values": [region]}]
            ):
                sold.update(o["InstanceType"] for o in page["InstanceTypeOfferings"])
            wanted = sorted(sold & set(prices))
            shapes: dict[str, InstanceType] = {}
            for i in range(0, len(wanted), 100):
                resp = ec2.describe_instance_types(InstanceTypes=wanted[i : i + 100])
                for raw in resp["InstanceTypes"]:
                    shapes[raw["InstanceType"]] = _to_instance_type(raw)
            spot: dict[str, float] = {}
            if self.spot and wanted:
                for page in ec2.get_paginator("describe_spot_price_history").paginate(
                    InstanceTypes=wanted,
                    ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                    StartTime=datetime.now(UTC),
                ):
                    for row in page["SpotPriceHistory"]:
                        usd = float(row["SpotPrice"])
                        t = row["InstanceType"]
                        spot[t] = min(usd, spot.get(t, usd))
        loc = Location("aws", region, None, continent=CONTINENT.get(region.split("-")[0], ""))
        offers = [Offer(shapes[t], loc, Capacity.ON_DEMAND, prices[t], "aws-price-list") for t in sorted(shapes)]
        outliers = 0
        for t, usd in sorted(spot.items()):
            if t not in shapes:
                continue
            if not (SPOT_OUTLIER_LOW * prices[t] <= usd <= prices[t]):
                outliers += 1
                continue
            offers.append(Offer(shapes[t], loc, Capacity.SPOT, usd, "aws-spot-price-history"))
        self.last_provenance.append(
            Provenance(
                source=f"aws:{self.price_list_url.format(region=region)}",
                date=published or datetime.now(UTC).date().isoformat(),
                rows=len(prices) + len(spot),
                offers=len(offers),
                dropped=len(prices) - len(shapes),
                outliers=outliers,
                provider="aws",
            )
        )
        return offers

    # -- lifecycle ----------------------------------------------------------------------------------------

    def _image(self, region: str, arch: str) -> str:
        if self.image_id:
            return self.image_id
        key = (region, arch)
        if key not in self._images:
            aws_arch = "arm64" if arch == "arm64" else "x86_64"
            with map_errors(self.name, region):
                imgs = self._ec2(region).describe_images(
                    Owners=["amazon"],
                    Filters=[
                        {"Name": "name", "Values": [f"al2023-ami-2023*-{aws_arch}"]},
                        {"Name": "architecture", "Values": [aws_arch]},
                    ],
                )["Images"]
            if not imgs:
                raise InvalidRequestError(
                    f"aws:{region}: no Amazon Linux 2023 image for {aws_arch}. To fix: pass image_id.",
                    provider="aws", region=region,
                )
            self._images[key] = max(imgs, key=lambda i: (i.get("CreationDate", ""), i["ImageId"]))["ImageId"]
        return self._images[key]

    def _to_instance(self, node: Node, region: str) -> Instance:
        extra = node.extra or {}
        tags = dict(extra.get("tags") or {})
        launched = extra.get("launch_time")
        try:
            launched_at = datetime.fromisoformat(str(launched).replace("Z", "+00:00")) if launched else None
        except ValueError:
            launched_at = None
        return Instance(
            id=str(node.id),
            provider="aws",
            region=region,
            instance_type=str(extra.get("instance_type") or ""),
            state=_state(node),
            zone=extra.get("availability"),
            tags=tags,
            launched_at=launched_at,
        )

    def _nodes(self, region: str, tags: Mapping[str, str] | None, request_id: str | None = None) -> list[Node]:
        filters: dict[str, Any] = {"tag-key": TAG_REQUEST}
        for k, v in (tags or {}).items():
            filters[f"tag:{k}"] = v
        with map_errors(self.name, region, request_id):
            nodes: list[Node] = self._driver(region).list_nodes(ex_filters=filters)  # type: ignore[arg-type]
        return [n for n in nodes if matches_tags((n.extra or {}).get("tags") or {}, tags)]

    def launch(
        self,
        offer: Offer,
        count: int,
        request_id: str,
        *,
        tags: Mapping[str, str],
        job: JobSpec | None = None,
    ) -> list[Instance]:
        region = offer.region
        if region not in self.regions:
            raise InvalidRequestError(
                f"aws: region {region} is not configured (have {self.regions}). To fix: add it to regions.",
                provider="aws", region=region, request_id=request_id,
            )
        existing = [
            n for n in self._nodes(region, {TAG_REQUEST: request_id}, request_id)
            if _state(n) is not InstanceState.TERMINATED
        ]
        if existing:
            return [self._to_instance(n, region) for n in existing]
        drv = self._driver(region)
        all_tags = launch_tags(tags, request_id)
        image = self._image(region, offer.instance_type.arch)
        # with a command, the VM runs the job, reports its exit code on the console and powers off
        userdata = completion_script(job.command, job.env, job.workdir) if job is not None and job.command else None
        with map_errors(self.name, region, request_id):
            location = None
            if offer.location.zone:
                location = next((z for z in drv.list_locations() if z.availability_zone.name ==
                                 offer.location.zone), None)
            size = NodeSize(offer.instance_type.name, offer.instance_type.name, 0, 0, None, 0.0, drv)
            made = drv.create_node(
                name=f"hb-{all_tags.get('hb-job', request_id)}"[:255],
                size=size,
                image=NodeImage(id=image, name=image, driver=drv),
                location=location,
                ex_mincount=count,
                ex_maxcount=count,
                ex_metadata=all_tags,
                ex_clienttoken=request_id[:64],
                ex_spot=offer.capacity is Capacity.SPOT,
                ex_userdata=userdata,
                ex_terminate_on_shutdown=userdata is not None,
            )
        nodes = made if isinstance(made, list) else [made]
        return [self._to_instance(n, region) for n in nodes]

    def instances(self, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """Our instances matching ``tags``. One that ended (``shutting-down``/``stopped``/``terminated``)
        without this adapter terminating it is reported ``succeeded``/``failed`` with ``exit_code`` when its
        console shows ``HB-EXIT-CODE=<n>`` (see :func:`completion_script`), else with its plain state."""
        out: list[Instance] = []
        for region in self.regions:
            for node in self._nodes(region, tags):
                inst = self._to_instance(node, region)
                code = self._exit_code(node, region)
                if code is not None:
                    state = InstanceState.SUCCEEDED if code == 0 else InstanceState.FAILED
                    inst = dataclasses.replace(inst, state=state, exit_code=code)
                out.append(inst)
        return out

    def _exit_code(self, node: Node, region: str) -> int | None:
        """The job's exit code from the console of an ended instance we did not terminate; cached per id
        (a miss only once the state is final, since the console of a VM still shutting down may grow)."""
        status = str((node.extra or {}).get("status") or node.state).lower()
        node_id = str(node.id)
        with self._lock:
            if node_id in self._exit_codes:
                return self._exit_codes[node_id]
            if status not in _ENDED or node_id in self._terminated:
                return None
        with map_errors(self.name, region):
            raw = self._ec2(region).get_console_output(InstanceId=node_id).get("Output") or ""
        try:
            text = base64.b64decode("".join(str(raw).split()), validate=True).decode("utf-8", "replace")
        except ValueError:
            text = str(raw)  # some emulators return it decoded
        code = parse_exit_code(text)
        if code is not None or status in _FINAL:
            with self._lock:
                self._exit_codes[node_id] = code
        return code

    def terminate(self, ids: Sequence[str], request_id: str) -> None:
        if not ids:
            return
        for region in self.regions:
            with map_errors(self.name, region, request_id):
                drv = self._driver(region)
                for node in drv.list_nodes(ex_filters={"instance-id": list(ids)}):  # type: ignore[arg-type]
                    if _state(node) is not InstanceState.TERMINATED:
                        with self._lock:
                            self._terminated.add(str(node.id))
                        drv.destroy_node(node)

    def poll_errors(self) -> list[ProviderError]:
        with self._lock:
            out, self._errors = self._errors, []
            return out
