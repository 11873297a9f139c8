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

from .base import TAG_REQUEST, Capability, launch_tags, matches_tags, reclaimed_error
from .bootstrap import (
    CONSOLES,
    EXIT_CODE_MARKER,
    Report,
    job_script,
    parse_exit_code,
    parse_report,
    script_for,
)
from .errors import map_errors
from .images import AWS_IMAGE_NAMES, image_key, pick

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
    "CONSOLE_READS",
]

DEFAULT_PRICE_LIST_URL = (
    "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
)
SPOT_OUTLIER_LOW = 0.05
_NS_BAD = 'xmlns="http://ec2.amazonaws.com/doc/2016-11-15"'
_NS_GOOD = 'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'
CONTINENT = {"us": "na", "ca": "na", "sa": "sa", "eu": "eu", "ap": "as", "me": "me", "af": "af", "il": "me"}
_ARCH = {"x86_64": "amd64", "arm64": "arm64"}
USER_DATA_MAX_BYTES = 16 * 1024  # EC2's limit on user data before base64
_ENDED = ("shutting-down", "stopping", "stopped", "terminated")
_FINAL = ("stopped", "terminated")  # console output will not change any more
CONSOLE_READS = 3  # reads of an ended instance's console before "no report" is believed


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
    runtime_limit_seconds: int | None = None,
) -> str:
    """The EC2 user data of a job: :func:`providers.bootstrap.job_script` within EC2's 16 KiB limit."""
    return job_script(command, env, workdir, consoles=consoles, poweroff=poweroff,
                      runtime_limit_seconds=runtime_limit_seconds, provider="aws", max_bytes=USER_DATA_MAX_BYTES)


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
        # still ending: the job is finished only once its exit code is read (or the instance is gone)
        "shutting-down": InstanceState.RUNNING,
        "stopping": InstanceState.RUNNING,
        "stopped": InstanceState.TERMINATED,
        "terminated": InstanceState.TERMINATED,
    }.get(status, InstanceState.UNKNOWN)


class AwsProvider:
    """AWS EC2 over ``regions`` (see the module docstring). Credentials: explicit keys, else boto3's chain
    (env, profile, role); Libcloud gets the same resolved keys."""

    name = "aws"
    capabilities = frozenset(
        {Capability.SPOT, Capability.GPUS, Capability.MULTI_NODE, Capability.TAGS, Capability.LIVE_PRICES,
         Capability.RUNS_WORK}
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
        max_runtime_hours: float | None = None,
        images: Mapping[str, str] | None = None,
    ) -> None:
        self.regions = list(regions)
        self.images = dict(images or {})
        self.endpoint_url = endpoint_url
        self.price_list_url = price_list_url or DEFAULT_PRICE_LIST_URL
        self.image_id = image_id
        self.spot = spot
        self.max_runtime_hours = max_runtime_hours
        self._session = boto3.Session(
            aws_access_key_id=access_key, aws_secret_access_key=secret_key, aws_session_token=session_token
        )
        self._drivers: dict[str, tuple[tuple[str, str, str | None], EC2NodeDriver]] = {}
        self._images: dict[tuple[str, str], str] = {}
        self._reports: dict[str, Report] = {}  # instance id -> what its console reported
        self._misses: dict[str, int] = {}  # instance id -> console reads without a report
        self._terminated: set[str] = set()  # ids this adapter terminated: their end is not the job's
        self._lock = threading.Lock()
        self._errors: list[ProviderError] = []
        self.last_provenance: list[Provenance] = []

    # -- clients ----------------------------------------------------------------------------------------

    def _ec2(self, region: str) -> Any:
        return self._session.client("ec2", region_name=region, endpoint_url=self.endpoint_url)

    def _driver(self, region: str) -> EC2NodeDriver:
        """Libcloud's driver for ``region``, signed with the session's *current* keys: boto3's credentials
        refresh themselves (instance/task roles, SSO, assumed roles), so the frozen copy is re-read on every
        use and the driver rebuilt when the keys rotated."""
        creds = self._session.get_credentials()
        if creds is None:
            from broker.errors import AuthError

            raise AuthError(
                "aws: no credentials. To fix: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE.",
                provider="aws", region=region,
            )
        with map_errors(self.name, region):
            frozen = creds.get_frozen_credentials()
        key = (frozen.access_key, frozen.secret_key, frozen.token)
        with self._lock:
            have = self._drivers.get(region)
            if have is not None and have[0] == key:
                return have[1]
            kwargs: dict[str, Any] = {"region": region, "signature_version": "4"}
            if frozen.token:
                kwargs["token"] = frozen.token
            if self.endpoint_url:
                url = urlparse(self.endpoint_url)
                drv: EC2NodeDriver = _ShimDriver(
                    frozen.access_key, frozen.secret_key, host=url.hostname, port=url.port,
                    secure=url.scheme == "https", **kwargs,
                )
            else:
                drv = EC2NodeDriver(frozen.access_key, frozen.secret_key, **kwargs)
            self._drivers[region] = (key, drv)
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
            spot_zone: dict[str, str | None] = {}  # the zone of the cheapest price: a spot launch goes there
            if self.spot and wanted:
                for page in ec2.get_paginator("describe_spot_price_history").paginate(
                    InstanceTypes=wanted,
                    ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                    StartTime=datetime.now(UTC),
                ):
                    for row in page["SpotPriceHistory"]:
                        usd = float(row["SpotPrice"])
                        t = row["InstanceType"]
                        if usd < spot.get(t, float("inf")):
                            spot[t] = usd
                            spot_zone[t] = row.get("AvailabilityZone")
        loc = Location("aws", region, None, continent=CONTINENT.get(region.split("-")[0], ""))
        offers = [Offer(shapes[t], loc, Capacity.ON_DEMAND, prices[t], "aws-price-list") for t in sorted(shapes)]
        outliers = 0
        for t, usd in sorted(spot.items()):
            if t not in shapes:
                continue
            if not (SPOT_OUTLIER_LOW * prices[t] <= usd <= prices[t]):
                outliers += 1
                continue
            zoned = dataclasses.replace(loc, zone=spot_zone.get(t)) if spot_zone.get(t) else loc
            offers.append(Offer(shapes[t], zoned, Capacity.SPOT, usd, "aws-spot-price-history"))
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

    def _image(self, region: str, shape: InstanceType) -> str:
        """``image_id`` when set, else the newest Amazon image of the shape's kind (:mod:`providers.images`):
        Amazon Linux 2023 for its architecture, the Deep Learning Base GPU AMI for GPU types."""
        if self.image_id:
            return self.image_id
        key = (region, image_key(shape))
        if key not in self._images:
            pattern = str(pick("aws", shape, AWS_IMAGE_NAMES, self.images, region=region))
            if pattern.startswith("ami-"):
                self._images[key] = pattern
                return pattern
            aws_arch = "arm64" if shape.arch == "arm64" else "x86_64"
            with map_errors(self.name, region):
                imgs = self._ec2(region).describe_images(
                    Owners=["amazon"],
                    Filters=[
                        {"Name": "name", "Values": [pattern]},
                        {"Name": "architecture", "Values": [aws_arch]},
                    ],
                )["Images"]
            if not imgs:
                raise InvalidRequestError(
                    f"aws:{region}: no Amazon image matches {pattern!r} for {aws_arch}. To fix: pass image_id or "
                    f"images={{'{key[1]}': 'ami-...'}}.",
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
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", region or ""):
            raise InvalidRequestError(
                f"aws: {region!r} is not an AWS region name. To fix: place the job in a region like us-east-1.",
                provider="aws", region=region, request_id=request_id,
            )
        if region not in self.regions:  # placement picked it from the catalog: watch it from now on
            with self._lock:
                if region not in self.regions:
                    self.regions.append(region)
        existing = [
            n for n in self._nodes(region, {TAG_REQUEST: request_id}, request_id)
            if _state(n) is not InstanceState.TERMINATED
        ]
        if existing:
            return [self._to_instance(n, region) for n in existing]
        drv = self._driver(region)
        all_tags = launch_tags(tags, request_id)
        image = self._image(region, offer.instance_type)
        # with a command, the VM runs the job, reports its exit code on the console and powers off
        userdata = None
        if job is not None and job.command:
            userdata = script_for(job, "aws", max_bytes=USER_DATA_MAX_BYTES, spot=offer.capacity is Capacity.SPOT,
                                  max_runtime_hours=self.max_runtime_hours)
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
                report = self._report(node, region)
                if report.preempted:  # the 2-minute notice came: the job was stopped for it, not failed
                    inst = dataclasses.replace(inst, state=InstanceState.TERMINATED)
                    self._preempted(inst)
                elif report.exit_code is not None:
                    state = InstanceState.SUCCEEDED if report.exit_code == 0 else InstanceState.FAILED
                    inst = dataclasses.replace(inst, state=state, exit_code=report.exit_code,
                                               log_tail=report.log_tail)
                elif report.pending:  # ended, report not on the console yet: not finished
                    inst = dataclasses.replace(inst, state=InstanceState.RUNNING)
                out.append(inst)
        return out

    def _report(self, node: Node, region: str) -> Report:
        """The job's exit code and log tail from the console of an ended instance we did not terminate
        (``GetConsoleOutput`` with ``Latest=true``: the newest output, not the boot-time snapshot); cached per
        id once a code is read, or after ``CONSOLE_READS`` reads of a final state without one (``pending`` until
        then: the console may lag the state)."""
        status = str((node.extra or {}).get("status") or node.state).lower()
        node_id = str(node.id)
        with self._lock:
            if node_id in self._reports:
                return self._reports[node_id]
            if status not in _ENDED or node_id in self._terminated:
                return Report(None)
        with map_errors(self.name, region):
            raw = self._ec2(region).get_console_output(InstanceId=node_id, Latest=True).get("Output") or ""
        try:
            text = base64.b64decode("".join(str(raw).split()), validate=True).decode("utf-8", "replace")
        except ValueError:
            text = str(raw)  # some emulators return it decoded
        report = parse_report(text)
        with self._lock:
            misses = self._misses[node_id] = self._misses.get(node_id, 0) + (report.exit_code is None)
            # EC2 posts console output a little after the state changes: a final state without the report
            # is believed only after CONSOLE_READS reads (until then the instance counts as still ending)
            if report.exit_code is not None or report.preempted or (status in _FINAL and misses >= CONSOLE_READS):
                self._reports[node_id] = report
                return report
        return Report(None, pending=True)

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

    def orphans(self, active_jobs: set[str]) -> list[Any]:
        """Unattached EBS volumes, ENIs and Elastic IPs tagged ``hb-request`` whose job is not active."""

        flt = [{"Name": "tag-key", "Values": [TAG_REQUEST]}]
        out = []
        for region in self.regions:
            ec2 = self._ec2(region)
            with map_errors(self.name, region):
                for v in ec2.describe_volumes(Filters=[*flt, {"Name": "status", "Values": ["available"]}])["Volumes"]:
                    out.append(self._orphan(region, "volume", v["VolumeId"], v.get("Tags")))
                for n in ec2.describe_network_interfaces(
                        Filters=[*flt, {"Name": "status", "Values": ["available"]}])["NetworkInterfaces"]:
                    out.append(self._orphan(region, "nic", n["NetworkInterfaceId"], n.get("TagSet")))
                for a in ec2.describe_addresses(Filters=flt)["Addresses"]:
                    if not a.get("AssociationId"):
                        out.append(self._orphan(region, "address", a["AllocationId"], a.get("Tags")))
        return [o for o in out if o.job not in active_jobs]

    @staticmethod
    def _orphan(region: str, kind: str, ident: str, tags: Any) -> Any:
        from .sweeper import Orphan

        t = {x["Key"]: x["Value"] for x in tags or []}
        return Orphan("aws", kind, f"{region}/{ident}", t.get("hb-job", ""), t.get(TAG_REQUEST, ""))

    def delete_orphans(self, items: Sequence[Any]) -> None:
        for o in items:
            region, _, ident = str(o.id).partition("/")
            ec2 = self._ec2(region)
            with map_errors(self.name, region):
                if o.kind == "volume":
                    ec2.delete_volume(VolumeId=ident)
                elif o.kind == "nic":
                    ec2.delete_network_interface(NetworkInterfaceId=ident)
                elif o.kind == "address":
                    ec2.release_address(AllocationId=ident)

    def _preempted(self, inst: Instance) -> None:
        with self._lock:
            if inst.id not in self._terminated:  # reported once
                self._terminated.add(inst.id)
                self._errors.append(reclaimed_error(inst, "got its interruption notice", "preempted"))

    def poll_errors(self) -> list[ProviderError]:
        with self._lock:
            out, self._errors = self._errors, []
            return out
