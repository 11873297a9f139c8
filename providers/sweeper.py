"""The orphan sweeper: delete what the broker launched but no active job owns any more.

Reconciliation (:meth:`broker.scheduler.Scheduler.reconcile`) runs once at start; the sweeper runs every
``interval_seconds`` from the scheduler loop and covers what reconciliation cannot see:

* **instances** tagged ``hb-request`` whose ``hb-job`` is not an active job (a crash between a launch and
  its record, a cancel that raced a launch, a failover whose cleanup call failed), older than
  ``grace_seconds`` so a launch in flight is never swept;
* **leftovers** an adapter reports through an optional ``orphans(active_jobs)`` / ``delete_orphans(items)`` pair:
  unattached tagged disks, NICs and public IPs (GCE boot disks of VMs that did not delete them, Azure NICs of
  VMs whose creation failed, EC2 volumes, ENIs and Elastic IPs carrying ``hb-request``).

Only providers with ``orphans`` (the cloud adapters) are swept: on-prem runs, edge tasks and dry-run
instances bill nothing when left over. Each orphan is an :class:`Orphan` ``(provider, kind, id, job,
request)``; a sweep returns what it deleted, and a failure of one provider is logged and does not stop
the others (the next sweep tries again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from broker.errors import ProviderError
from broker.model import InstanceState

from .base import TAG_JOB, TAG_ON, TAG_POOL, TAG_REQUEST, Provider

__all__ = ["Orphan", "Sweeper", "sweep"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Orphan:
    """Something a provider holds for a job that is no longer active: ``kind`` is ``instance``, ``disk``,
    ``nic``, ``address`` or ``volume``; ``id`` is the provider's id for it."""

    provider: str
    kind: str
    id: str
    job: str = ""
    request: str = ""


def find_orphans(provider: Provider, active_jobs: set[str], now: datetime, grace_seconds: float) -> list[Orphan]:
    """Instances and adapter-reported leftovers of ``provider`` that belong to no job in ``active_jobs``."""
    out: list[Orphan] = []
    cutoff = now - timedelta(seconds=grace_seconds)
    for inst in provider.instances(None):
        job = inst.tags.get(TAG_JOB, "")
        if TAG_REQUEST not in inst.tags or job in active_jobs:
            continue
        if TAG_POOL in inst.tags and TAG_ON not in inst.tags:
            continue  # a warm pool's own instance (broker.ops.autoscale keeps it), not a job's leftover
        if inst.launched_at is not None and inst.launched_at > cutoff:
            continue  # maybe a launch whose job row is not written yet
        if inst.state is InstanceState.TERMINATED and provider.name == "aws":
            continue  # EC2 keeps terminated instances listed for a while: nothing to delete
        out.append(Orphan(provider.name, "instance", inst.id, job, inst.tags.get(TAG_REQUEST, "")))
    leftovers: Callable[[set[str]], Iterable[Orphan]] | None = getattr(provider, "orphans", None)
    if leftovers is not None:
        out.extend(leftovers(active_jobs))
    return out


def sweep(
    providers: Mapping[str, Provider],
    active_jobs: Iterable[str],
    *,
    now: datetime,
    grace_seconds: float = 600.0,
) -> list[Orphan]:
    """Delete every orphan of every provider (see the module docstring); returns what was deleted."""
    active = set(active_jobs)
    deleted: list[Orphan] = []
    for name, provider in providers.items():
        if not hasattr(provider, "orphans"):
            continue  # only cloud adapters: on-prem, edge and dry-run keep no billed leftovers
        try:
            found = find_orphans(provider, active, now, grace_seconds)
            instances = [o.id for o in found if o.kind == "instance"]
            if instances:
                provider.terminate(instances, "sweeper")
            rest: Sequence[Orphan] = [o for o in found if o.kind != "instance"]
            if rest:
                provider.delete_orphans(rest)  # type: ignore[attr-defined]
            deleted.extend(found)
        except ProviderError as exc:
            log.warning("sweeper: %s: %s (tried again at the next sweep)", name, exc)
    if deleted:
        log.info("sweeper deleted %d orphan(s): %s", len(deleted),
                 ", ".join(f"{o.provider}:{o.kind}:{o.id}" for o in deleted))
    return deleted


class Sweeper:
    """Runs :func:`sweep` at most every ``interval_seconds`` (``0`` turns it off).
    :meth:`from_env` reads ``BROKER_SWEEP_INTERVAL_SECONDS`` and ``BROKER_SWEEP_GRACE_SECONDS``."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Sweeper:
        import os

        e = os.environ if env is None else env
        values = []
        for name, default in (("BROKER_SWEEP_INTERVAL_SECONDS", 600.0), ("BROKER_SWEEP_GRACE_SECONDS", 600.0)):
            raw = e.get(name) or ""
            try:
                value = float(raw) if raw else default
            except ValueError:
                log.warning("%s=%r is not a number of seconds; using %g", name, raw, default)
                value = default
            values.append(max(0.0, value))
        return cls(values[0], values[1])

    def __init__(self, interval_seconds: float = 600.0, grace_seconds: float = 600.0) -> None:
        self.interval_seconds = interval_seconds
        self.grace_seconds = grace_seconds
        self.last: datetime | None = None
        self.deleted: list[Orphan] = []

    def due(self, now: datetime) -> bool:
        return self.interval_seconds > 0 and (
            self.last is None or (now - self.last).total_seconds() >= self.interval_seconds)

    def maybe_run(self, providers: Mapping[str, Provider], active_jobs: Callable[[], Iterable[str]],
                  now: datetime) -> list[Orphan]:
        """Sweep when due (``active_jobs`` is only called then); returns what was deleted."""
        if self.last is None:  # reconciliation covers the start; the first sweep is one interval later
            self.last = now
            return []
        if not self.due(now):
            return []
        self.last = now
        got = sweep(providers, active_jobs(), now=now, grace_seconds=self.grace_seconds)
        self.deleted.extend(got)
        return got
