"""The unified model of hybrid-broker: where work can run, what it costs, what a job asks for.

Stdlib only; every other package imports from here and this module imports nothing of the
project. Types are frozen dataclasses with the unit in the field name (``memory_gib``,
``hourly_usd``, ``size_gib``). What is *asked for* (:class:`Request`) and what is *offered*
(:class:`Offer`) are separate types; a :class:`PlacementOption` joins the two with the cost
breakdown that explains it.

Location keys are ``"provider:region"`` strings (``"aws:us-east-1"``, ``"onprem:rack-a"``,
``"edge:dev-42"``); a zone, where known, is a separate field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

__all__ = [
    "SiteKind",
    "Capacity",
    "SpotPolicy",
    "Objective",
    "Arch",
    "JobState",
    "TERMINAL_STATES",
    "ALLOWED_TRANSITIONS",
    "can_transition",
    "Location",
    "InstanceType",
    "Offer",
    "DataInput",
    "Request",
    "RetryPolicy",
    "CheckpointSpec",
    "JobSpec",
    "PlacementOption",
    "PlacementResult",
    "Provenance",
    "InstanceState",
    "Instance",
    "Attempt",
    "location_key",
    "split_location_key",
]


class SiteKind(StrEnum):
    """Where a location physically is: a public cloud, the team's own racks, or an edge device."""

    CLOUD = "cloud"
    ONPREM = "onprem"
    EDGE = "edge"


class Capacity(StrEnum):
    """How capacity is bought. ``owned`` is on-prem or edge hardware (price = owned cost, often 0)."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    RESERVED = "reserved"
    OWNED = "owned"


class SpotPolicy(StrEnum):
    NEVER = "never"
    ALLOWED = "allowed"
    REQUIRED = "required"


class Objective(StrEnum):
    """What placement minimises: total dollars, or predicted finish time (cost breaks ties)."""

    COST = "cost"
    TIME = "time"


class Arch(StrEnum):
    AMD64 = "amd64"
    ARM64 = "arm64"
    ANY = "any"


class JobState(StrEnum):
    PENDING = "PENDING"
    PLACED = "PLACED"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    BACKOFF = "BACKOFF"


TERMINAL_STATES: frozenset[JobState] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

# The job lifecycle. Every state may be cancelled until it is terminal; PLACED/PROVISIONING/RUNNING
# may fail over to BACKOFF (retryable) or FAILED; RUNNING may be preempted back to PENDING.
ALLOWED_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.PLACED, JobState.FAILED, JobState.CANCELLED}),
    JobState.PLACED: frozenset(
        {JobState.PROVISIONING, JobState.PENDING, JobState.BACKOFF, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.PROVISIONING: frozenset(
        {JobState.RUNNING, JobState.BACKOFF, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.BACKOFF,
            JobState.PENDING,  # preempted (after a checkpoint) or its device went offline
        }
    ),
    JobState.BACKOFF: frozenset({JobState.PENDING, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def can_transition(src: JobState, dst: JobState) -> bool:
    """True when the lifecycle allows ``src -> dst``."""
    return dst in ALLOWED_TRANSITIONS[src]


def location_key(provider: str, region: str) -> str:
    """The canonical ``"provider:region"`` key of a location."""
    return f"{provider}:{region}"


def split_location_key(key: str) -> tuple[str, str]:
    """Inverse of :func:`location_key`. Raises ``ValueError`` when ``key`` has no ``:``."""
    provider, sep, region = key.partition(":")
    if not sep or not provider or not region:
        raise ValueError(f"location {key!r} is not of the form provider:region (e.g. aws:us-east-1)")
    return provider, region


@dataclass(frozen=True, slots=True)
class Location:
    """A place work can run. ``continent`` is a coarse geo tag (``na``, ``eu``, ``as``, ``sa``, ``oc``, ``af``,
    ``me``) used by the egress and bandwidth model; empty when unknown."""

    provider: str
    region: str
    zone: str | None = None
    site: SiteKind = SiteKind.CLOUD
    continent: str = ""

    @property
    def key(self) -> str:
        return location_key(self.provider, self.region)


@dataclass(frozen=True, slots=True)
class InstanceType:
    """A machine shape. ``gpus`` counts whole accelerators; ``accelerator`` names their model (``A100``,
    ``T4``, ``A100-80GB``...) or is ``None``; ``gpu_memory_gib`` is per accelerator."""

    name: str
    vcpus: float
    memory_gib: float
    gpus: int = 0
    accelerator: str | None = None
    gpu_memory_gib: float = 0.0
    arch: str = Arch.AMD64.value
    network_gbps: float | None = None
    interconnect: str | None = None  # "nvlink", "nvswitch" or None: used by topology-aware placement


@dataclass(frozen=True, slots=True)
class Offer:
    """An instance type at a location, bought one way, for ``hourly_usd`` per instance-hour."""

    instance_type: InstanceType
    location: Location
    capacity: Capacity
    hourly_usd: float
    source: str = ""  # which catalog source priced it (display and provenance only)
    outlier: bool = False  # flagged by the catalog's outlier rule (pricing.catalog.flag_outliers)

    @property
    def provider(self) -> str:
        return self.location.provider

    @property
    def region(self) -> str:
        return self.location.region


@dataclass(frozen=True, slots=True)
class DataInput:
    """A dataset the job reads before it starts: ``size_gib`` GiB stored at ``location`` (``provider:region``)."""

    uri: str
    location: str
    size_gib: float


@dataclass(frozen=True, slots=True)
class Request:
    """What one job asks of a placement. Resources are per node; ``nodes`` > 1 is a gang.

    ``providers``/``regions`` are allow-lists (empty = any). ``deadline`` is timezone-aware UTC or ``None``.
    ``max_hourly_usd`` caps the hourly price of one node (``None`` = no cap). ``node_selector`` (label
    pairs) admits only edge devices carrying every one of those labels.
    """

    name: str
    vcpus: float
    memory_gib: float
    gpus: int = 0
    accelerator: str | None = None
    arch: str = Arch.AMD64.value
    duration_hours: float = 1.0
    deadline: datetime | None = None
    data: tuple[DataInput, ...] = ()
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    spot: SpotPolicy = SpotPolicy.NEVER
    max_hourly_usd: float | None = None
    objective: Objective = Objective.COST
    nodes: int = 1
    same_zone: bool = False
    interconnect: str | None = None
    include_outliers: bool = False
    allow_burstable: bool = False  # placement.burstable: allowed (see policies/placement/burstable.py)
    node_selector: tuple[tuple[str, str], ...] = ()  # placement.nodeSelector: edge device labels, sorted pairs


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Kubernetes-Job-shaped retry: at most ``backoff_limit`` retries, delays doubling from
    ``retry_delay_seconds`` up to ``max_retry_delay_seconds``."""

    backoff_limit: int = 6
    retry_delay_seconds: float = 10.0
    max_retry_delay_seconds: float = 120.0


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    path: str
    interval_minutes: float = 15.0


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job spec (the Kubernetes-shaped YAML of ``docs/JOBSPEC.md``).

    ``requests``/``limits`` keep the parsed resource maps (cpu in cores, memory in GiB, GPUs as counts)
    because QoS classes and quotas read them; ``request`` is what placement reads.
    """

    name: str
    request: Request
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()
    image: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    priority_class_name: str | None = None
    priority: int | None = None
    queue: str | None = None
    requests: Mapping[str, float] = field(default_factory=dict)
    limits: Mapping[str, float] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    checkpoint: CheckpointSpec | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)  # the spec as submitted, for display and storage


@dataclass(frozen=True, slots=True)
class PlacementOption:
    """One way to run a request, with its cost breakdown (all USD for the whole job, all nodes).

    ``compute_usd = hourly_usd * nodes * (duration_hours + transfer_hours)``; ``egress_usd`` is what moving
    every data input to this location costs; ``interruption_usd`` the expected cost of spot interruptions (0
    for other capacity); ``total_usd = compute_usd + egress_usd + interruption_usd``.
    """

    provider: str
    region: str
    zone: str | None
    instance_type: str
    capacity: str
    vcpus: float
    memory_gib: float
    gpus: int
    accelerator: str | None
    hourly_usd: float
    compute_usd: float
    egress_usd: float
    transfer_hours: float
    total_usd: float
    site: str = SiteKind.CLOUD.value
    finish_hours: float = 0.0  # predicted hours from now to finish (transfer + duration), for deadlines
    arch: str = "amd64"  # of the instance type: the adapter picks an image of this architecture
    interruption_usd: float = 0.0  # spot only: expected cost of interruptions (pricing/interruption.py)

    # The exact keys of the OPTION object of `broker place --json` (the public contract).
    CONTRACT_KEYS = (
        "provider",
        "region",
        "zone",
        "instance_type",
        "capacity",
        "vcpus",
        "memory_gib",
        "gpus",
        "accelerator",
        "hourly_usd",
        "compute_usd",
        "egress_usd",
        "transfer_hours",
        "total_usd",
        "interruption_usd",
    )

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.CONTRACT_KEYS}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlacementOption:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


@dataclass(frozen=True, slots=True)
class PlacementResult:
    """The answer of placement: the best option (``None`` when nothing is feasible), ranked alternatives,
    and how many offers were considered, feasible, and rejected by each reason."""

    job: str
    placement: PlacementOption | None
    alternatives: tuple[PlacementOption, ...] = ()
    considered: int = 0
    feasible: int = 0
    rejected: Mapping[str, int] = field(default_factory=dict)
    catalog_version: str = ""
    explanation: str = ""
    # What the report's savings baselines need, from the same catalog and constraints (empty unless asked:
    # ``place(..., baselines=True)``; see policies/placement/baselines.py). Not part of the JSON contract.
    baselines: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON contract of ``broker place --json`` and ``POST /v1/placements:preview``."""
        return {
            "job": self.job,
            "placement": None if self.placement is None else self.placement.to_dict(),
            "alternatives": [a.to_dict() for a in self.alternatives],
            "considered": self.considered,
            "feasible": self.feasible,
            "rejected": dict(self.rejected),
        }


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where an offer set came from: ``source`` (e.g. ``libcloud-3.9.1:pricing.json``,
    ``skypilot-v8:/path``), the data's own ``date`` (ISO), and row counts by kind."""

    source: str
    date: str
    rows: int = 0
    offers: int = 0
    dropped: int = 0
    duplicates: int = 0
    outliers: int = 0
    provider: str = ""
    # Rows of this source left out because a later dated price change makes their price wrong
    # (pricing/data/price-changes.csv); the list-price table puts back the current price where it knows it.
    superseded: int = 0


class InstanceState(StrEnum):
    """What a provider reports of one instance. ``succeeded``/``failed`` are for providers that run the work
    themselves (on-prem, edge) and so know when it ended; cloud VMs go ``pending -> running -> terminated``."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TERMINATED = "terminated"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Instance:
    """One unit of capacity a provider launched for a request. ``id`` is unique within the provider;
    ``tags`` always carry ``hb-job`` (the job id) and ``hb-request`` (the idempotency key of the launch)."""

    id: str
    provider: str
    region: str
    instance_type: str
    state: InstanceState
    zone: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    exit_code: int | None = None
    launched_at: datetime | None = None
    dry_run: bool = False
    log_tail: str = ""  # the last bytes of the job's output a cloud VM reported with its exit code


@dataclass(frozen=True, slots=True)
class Attempt:
    """One provisioning attempt, as the failover loop reports it so the broker can record it.

    ``outcome`` is ``launched``, ``capacity``, ``quota``, ``transient``, ``auth``, ``invalid`` or ``skipped``
    (offer blocked); ``delay_seconds`` is the backoff slept before the next attempt (0 when none)."""

    provider: str
    region: str
    instance_type: str
    capacity: str
    outcome: str
    message: str = ""
    at: datetime | None = None
    delay_seconds: float = 0.0
    retryable: bool = False
