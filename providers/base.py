"""The one small ``Provider`` protocol every adapter implements, its capability flags and tag names.

Design choice: adapters are cheap, stateless-looking objects (caches live in helpers) so the broker
can build one per use; the only state a provider keeps is what the *remote* side keeps (instances and
their tags), which is why idempotency and reconciliation go through tags, never through memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol, runtime_checkable

from broker.errors import InvalidRequestError, ProviderError
from broker.model import (
    Capacity,
    Instance,
    InstanceState,
    InstanceType,
    JobSpec,
    Location,
    Offer,
    PlacementOption,
    SiteKind,
)

__all__ = [
    "Capability",
    "Provider",
    "ProviderCheck",
    "TAG_JOB",
    "TAG_REQUEST",
    "TAG_DRY_RUN",
    "TAG_POOL",
    "TAG_ON",
    "run_id",
    "launch_tags",
    "matches_tags",
    "reclaimed_error",
    "require_count",
    "offer_from_option",
    "offer_instance",
]

TAG_JOB = "hb-job"
TAG_REQUEST = "hb-request"
TAG_DRY_RUN = "hb-dry-run"
TAG_POOL = "hb-pool"  # an instance a broker-owned pool keeps warm (broker.ops.autoscale): up until terminated
TAG_ON = "hb-on"  # a run of a job on an already running (warm pool) instance: that instance's id


class Capability(StrEnum):
    """What a provider can do, checked before placement (not discovered as ``NotImplementedError``)."""

    SPOT = "spot"  # sells interruptible capacity
    GPUS = "gpus"  # has accelerator instance types
    MULTI_NODE = "multi-node"  # one launch may create count > 1 instances (gangs)
    RUNS_WORK = "runs-work"  # executes the job's command itself and reports its exit code (on-prem)
    TAGS = "tags"  # instances carry tags, so reconciliation by tag works
    LIVE_PRICES = "live-prices"  # offers() pulls prices from the provider's own price API
    DRY_RUN = "dry-run"  # nothing real is created: instances are simulated and labelled dry_run
    # runs a job on one of its already running instances (a warm pool's): ``run_on(instance_id, request_id,
    # *, tags, job) -> Instance`` returns the run as an instance of its own (id ``run_id(...)``, tag hb-on),
    # idempotent per request id; terminating the run stops the job, not the instance; terminating the
    # instance ends its runs
    WARM_RUNS = "warm-runs"


@runtime_checkable
class Provider(Protocol):
    """A place that sells (or owns) capacity.

    Contract:

    * **Eventually consistent**: an instance returned by :meth:`launch` may take a while to show in
      :meth:`instances`; a terminated one may still be listed (state ``terminated``) for a while.
    * **Idempotent per request_id**: calling :meth:`launch` again with the same ``request_id`` returns the
      same instances instead of creating more; :meth:`terminate` of an already terminated id is a no-op.
    * **Unique instance ids** within the provider.
    * Every failure leaves the adapter as a subclass of :class:`broker.errors.ProviderError`
      (see :func:`providers.errors.map_errors`), never a raw SDK exception.
    """

    name: str
    capabilities: frozenset[Capability]

    def offers(self) -> list[Offer]:
        """Instance types x locations x capacity kinds this provider sells now, with hourly USD prices."""
        ...

    def launch(
        self,
        offer: Offer,
        count: int,
        request_id: str,
        *,
        tags: Mapping[str, str],
        job: JobSpec | None = None,
    ) -> list[Instance]:
        """Create ``count`` instances of ``offer``. ``tags`` include ``hb-job`` and ``hb-request``;
        the adapter adds ``hb-request=request_id`` when missing. Idempotent per ``request_id``."""
        ...

    def instances(self, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """Instances this provider knows whose tags include every item of ``tags``
        (``None`` = all of ours)."""
        ...

    def terminate(self, ids: Sequence[str], request_id: str) -> None:
        """Terminate instances by id. Unknown or already terminated ids are ignored (idempotent)."""
        ...

    def poll_errors(self) -> list[ProviderError]:
        """Errors seen asynchronously since the last call (e.g. a spot instance reclaimed); drains them."""
        ...


@dataclass(frozen=True, slots=True)
class ProviderCheck:
    """Whether a provider can be used from here: ``usable``, and why not (``reason``), and which credential
    source of the cloud's standard chain was found (``credentials_source``, empty when none)."""

    name: str
    usable: bool
    reason: str
    credentials_source: str = ""


def launch_tags(tags: Mapping[str, str], request_id: str) -> dict[str, str]:
    """The tags for launched instances: ``tags`` plus ``hb-request`` (and ``hb-job``, defaulting to it)."""
    out = dict(tags)
    out.setdefault(TAG_REQUEST, request_id)
    out.setdefault(TAG_JOB, request_id)
    return out


def require_count(provider: str, offer: Offer, count: int, request_id: str) -> None:
    """Refuse a launch of fewer than one instance with an :class:`InvalidRequestError` every adapter shares."""
    if count < 1:
        raise InvalidRequestError(
            f"{provider}: count must be >= 1, got {count}. To fix: ask for at least one instance.",
            provider=provider,
            region=offer.region,
            request_id=request_id,
        )


def offer_instance(
    iid: str,
    provider: str,
    offer: Offer,
    tags: Mapping[str, str],
    *,
    launched_at: datetime | None = None,
    dry_run: bool = False,
) -> Instance:
    """A running :class:`Instance` of ``offer`` (region, zone and type taken from it), for in-memory adapters."""
    return Instance(
        id=iid,
        provider=provider,
        region=offer.region,
        zone=offer.location.zone,
        instance_type=offer.instance_type.name,
        state=InstanceState.RUNNING,
        tags=tags,
        launched_at=launched_at,
        dry_run=dry_run,
    )


def reclaimed_error(inst: Instance, what: str = "was preempted", code: str = "preempted") -> ProviderError:
    """The retryable ``CapacityError`` an adapter queues for :meth:`Provider.poll_errors` when the cloud took
    a spot instance back (``what`` says how: preempted, evicted, got its interruption notice)."""
    from broker.errors import CapacityError

    return CapacityError(
        f"{inst.provider}:{inst.region}: spot instance {inst.id} {what}. To fix: nothing; the broker places the "
        "job again (use on-demand capacity to avoid interruptions).",
        provider=inst.provider, region=inst.region, request_id=inst.tags.get(TAG_REQUEST), code=code,
        retryable=True,
    )


def run_id(instance_id: str, request_id: str) -> str:
    """The id of the run of request ``request_id`` on instance ``instance_id`` (:attr:`Capability.WARM_RUNS`)."""
    import hashlib

    return f"{instance_id}~{hashlib.sha256(request_id.encode()).hexdigest()[:10]}"


def matches_tags(have: Mapping[str, str], want: Mapping[str, str] | None) -> bool:
    """True when every ``want`` item is in ``have`` (``None`` or empty matches everything)."""
    return not want or all(have.get(k) == v for k, v in want.items())


def offer_from_option(option: PlacementOption) -> Offer:
    """The :class:`Offer` a placement option names (what :meth:`Provider.launch` takes)."""
    try:
        site = SiteKind(option.site)
    except ValueError:
        site = SiteKind.CLOUD
    try:
        capacity = Capacity(option.capacity)
    except ValueError:
        capacity = Capacity.ON_DEMAND
    return Offer(
        instance_type=InstanceType(
            name=option.instance_type,
            vcpus=option.vcpus,
            memory_gib=option.memory_gib,
            gpus=option.gpus,
            accelerator=option.accelerator,
            arch=getattr(option, "arch", "amd64") or "amd64",
        ),
        location=Location(option.provider, option.region, option.zone, site),
        capacity=capacity,
        hourly_usd=option.hourly_usd,
    )
