"""What the scheduling policies see of a job: a :class:`Workload`, and the :class:`Resources` vectors
it asks for.

Policies in this package never read the store or a provider: the broker turns each job into a
``Workload`` (see :meth:`Workload.from_spec`) and passes snapshots of plain values. Quantities follow
Kubernetes (``"500m"`` cpu, ``"32Gi"`` memory) and are parsed once by :func:`parse_quantity`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from broker.errors import SpecError
from broker.model import JobSpec

__all__ = [
    "CPU",
    "MEMORY",
    "GPU",
    "Resources",
    "Workload",
    "parse_quantity",
    "parse_cpu",
    "parse_memory_gib",
    "resources_of",
]

CPU = "cpu"
MEMORY = "memory"
GPU = "nvidia.com/gpu"
_GPU_ALIASES = ("nvidia.com/gpu", "gpu", "gpus", "amd.com/gpu")

_QUANTITY = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
            "P": 1e15, "E": 1e18}


def parse_quantity(value: object, *, field_name: str = "quantity") -> float:
    """Parse a Kubernetes quantity (``8``, ``"500m"``, ``"32Gi"``, ``"1.5G"``) into a plain number of base
    units (cores, bytes, counts). Raises :class:`SpecError` naming ``field_name`` when it is not one."""
    if isinstance(value, bool):
        raise SpecError(field_name, f"expected a quantity, got {value!r}. To fix: write e.g. 8, '500m' or '32Gi'")
    if isinstance(value, int | float):
        number = float(value)
    else:
        match = _QUANTITY.match(str(value))
        if not match:
            raise SpecError(field_name, f"{value!r} is not a quantity. To fix: write e.g. 8, '500m' or '32Gi'")
        digits, suffix = match.groups()
        if suffix in _BINARY:
            number = float(digits) * _BINARY[suffix]
        elif suffix in _DECIMAL:
            number = float(digits) * _DECIMAL[suffix]
        else:
            raise SpecError(field_name, f"unknown unit {suffix!r} in {value!r}. To fix: use m, k, M, G, Ki, Mi, Gi, Ti")
    if number < 0:
        raise SpecError(field_name, f"{value!r} is negative. To fix: quantities are >= 0")
    return number


def parse_cpu(value: object, *, field_name: str = "cpu") -> float:
    """Cores from a cpu quantity (``"500m"`` -> 0.5)."""
    return parse_quantity(value, field_name=field_name)


def parse_memory_gib(value: object, *, field_name: str = "memory") -> float:
    """GiB from a memory quantity (``"512Mi"`` -> 0.5). A bare number is bytes, as in Kubernetes (and
    ``broker/spec.py``); a bare number below 4096 is refused as the likely mistake it is."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 4096:
        raise SpecError(field_name, f"{value!r} without a unit means {value} bytes. To fix: write {value}Gi")
    text = str(value).strip()
    if re.fullmatch(r"[0-9]*\.?[0-9]+", text) and 0 < float(text) < 4096:
        raise SpecError(field_name, f"{value!r} without a unit means {text} bytes. To fix: write {text}Gi")
    return parse_quantity(value, field_name=field_name) / 2**30


@dataclass(frozen=True, slots=True)
class Resources:
    """A resource vector: ``cpu`` cores, ``memory_gib`` GiB, ``gpus`` accelerators. Arithmetic is
    element-wise; :meth:`fits_in` is the capacity test every policy uses (equality fits)."""

    cpu: float = 0.0
    memory_gib: float = 0.0
    gpus: float = 0.0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory_gib + other.memory_gib, self.gpus + other.gpus)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.memory_gib - other.memory_gib, self.gpus - other.gpus)

    def scale(self, factor: float) -> Resources:
        return Resources(self.cpu * factor, self.memory_gib * factor, self.gpus * factor)

    def clamp(self) -> Resources:
        """Negative components set to 0."""
        return Resources(max(0.0, self.cpu), max(0.0, self.memory_gib), max(0.0, self.gpus))

    def fits_in(self, capacity: Resources, *, eps: float = 1e-9) -> bool:
        return (
            self.cpu <= capacity.cpu + eps
            and self.memory_gib <= capacity.memory_gib + eps
            and self.gpus <= capacity.gpus + eps
        )

    @classmethod
    def total(cls, items: object) -> Resources:
        acc = cls()
        for r in items:  # type: ignore[attr-defined]
            acc = acc + r
        return acc


def _gpu_of(resources: Mapping[str, float]) -> float:
    for key in _GPU_ALIASES:
        if key in resources:
            return float(resources[key])
    return 0.0


def resources_of(resources: Mapping[str, float]) -> Resources:
    """The :class:`Resources` of a ``cpu``/``memory``/``nvidia.com/gpu`` map (missing keys are 0)."""
    return Resources(
        cpu=float(resources.get(CPU, 0.0)),
        memory_gib=float(resources.get(MEMORY, resources.get("memory_gib", 0.0))),
        gpus=_gpu_of(resources),
    )


@dataclass(frozen=True, slots=True)
class Workload:
    """One job as the policies see it (all times timezone-aware UTC).

    ``requests``/``limits`` are per node, keyed ``cpu`` (cores), ``memory`` (GiB), ``nvidia.com/gpu``
    (count), as :class:`broker.model.JobSpec` keeps them. ``estimated_usd`` is the priced estimate of
    the whole job (the placement's ``total_usd``), which budgets charge. ``host`` is where it runs
    (``None`` while pending). ``started_at``/``last_checkpoint_at`` drive the work-lost measure of
    preemption; ``checkpoint_interval_seconds`` is ``None`` for jobs that never checkpoint.
    """

    id: str
    namespace: str
    created_at: datetime
    priority: int = 0
    priority_class: str | None = None
    preemption_policy: str = "PreemptLowerPriority"
    requests: Mapping[str, float] = field(default_factory=dict)
    limits: Mapping[str, float] = field(default_factory=dict)
    nodes: int = 1
    deadline: datetime | None = None
    estimated_usd: float = 0.0
    queue: str | None = None
    providers: tuple[str, ...] = ()
    checkpoint_interval_seconds: float | None = None
    started_at: datetime | None = None
    last_checkpoint_at: datetime | None = None
    host: str | None = None

    @property
    def per_node(self) -> Resources:
        """Requested resources of one node; a limit stands in for a missing request (as Kubernetes does)."""
        req = resources_of(self.requests)
        lim = resources_of(self.limits)
        return Resources(
            cpu=req.cpu if CPU in self.requests else lim.cpu,
            memory_gib=req.memory_gib if (MEMORY in self.requests or "memory_gib" in self.requests)
            else lim.memory_gib,
            gpus=max(req.gpus, lim.gpus),
        )

    @property
    def total(self) -> Resources:
        """Requested resources of all ``nodes``."""
        return self.per_node.scale(self.nodes)

    def work_lost_seconds(self, now: datetime) -> float:
        """Seconds of work a stop now would lose: since the last checkpoint, else since the start
        (0 for a job that has not started)."""
        if self.started_at is None:
            return 0.0
        since = self.started_at
        if self.last_checkpoint_at is not None and self.last_checkpoint_at > since:
            since = self.last_checkpoint_at
        return max(0.0, (now - since).total_seconds())

    def with_(self, **changes: object) -> Workload:
        """A copy with ``changes`` applied (frozen dataclass helper)."""
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_spec(
        cls,
        job_id: str,
        spec: JobSpec,
        *,
        created_at: datetime | None = None,
        estimated_usd: float = 0.0,
        priority: int | None = None,
        preemption_policy: str | None = None,
        started_at: datetime | None = None,
        last_checkpoint_at: datetime | None = None,
        host: str | None = None,
    ) -> Workload:
        """Build the policies' view of a stored job. ``priority`` overrides ``spec.priority`` (pass the value
        resolved by :func:`policies.priority.resolve`)."""
        req = spec.request
        requests = dict(spec.requests) or {CPU: req.vcpus, MEMORY: req.memory_gib, GPU: float(req.gpus)}
        interval = spec.checkpoint.interval_minutes * 60.0 if spec.checkpoint is not None else None
        return cls(
            id=job_id,
            namespace=spec.namespace or "default",
            created_at=created_at or datetime.now(UTC),
            priority=priority if priority is not None else (spec.priority or 0),
            priority_class=spec.priority_class_name,
            preemption_policy=preemption_policy or "PreemptLowerPriority",
            requests=requests,
            limits=dict(spec.limits),
            nodes=max(1, req.nodes),
            deadline=req.deadline,
            estimated_usd=estimated_usd,
            queue=spec.queue,
            providers=tuple(req.providers),
            checkpoint_interval_seconds=interval,
            started_at=started_at,
            last_checkpoint_at=last_checkpoint_at,
            host=host,
        )
