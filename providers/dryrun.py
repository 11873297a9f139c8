"""Dry-run provider: what the broker uses for a cloud it has no credentials for.

Launch creates nothing anywhere: it returns instances marked ``dry_run=True`` (and tagged
``hb-dry-run=true``) that "run" for the job's duration estimate on the injected clock, then report
``succeeded`` with exit code 0; a warm pool's instance (tag ``hb-pool``) runs until it is terminated, and
:meth:`DryRunProvider.run_on` runs a job on it the same way (``Capability.WARM_RUNS``). Offers are
whatever catalog offers it is given, so placement and reports work the same as with real credentials, and
every instance says plainly that it was simulated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from broker.clock import Clock, SystemClock
from broker.errors import ProviderError
from broker.model import Instance, InstanceState, JobSpec, Offer

from .base import (
    TAG_DRY_RUN,
    TAG_ON,
    TAG_POOL,
    Capability,
    launch_tags,
    matches_tags,
    offer_instance,
    require_count,
    run_id,
)

__all__ = ["DryRunProvider", "DEFAULT_DURATION_HOURS"]

DEFAULT_DURATION_HOURS = 1.0


@dataclass
class _Run:
    instance: Instance
    ends_at: datetime
    terminated: bool = False


class DryRunProvider:
    """A simulated provider named ``name`` (e.g. ``aws``) selling ``offers``; see the module docstring.

    Instance ids are ``dry-<name>-<hash of request id>-<n>`` so they are unique, deterministic per request
    and visibly simulated. A launch lasts ``job.request.duration_hours`` (1 h without a job).
    """

    def __init__(self, name: str, offers: Iterable[Offer] = (), *, clock: Clock | None = None) -> None:
        self.name = name
        self.capabilities = frozenset(
            {Capability.SPOT, Capability.GPUS, Capability.MULTI_NODE, Capability.TAGS, Capability.DRY_RUN,
             Capability.WARM_RUNS}
        )
        self._offers = list(offers)
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._by_request: dict[str, list[str]] = {}

    def offers(self) -> list[Offer]:
        return list(self._offers)

    def launch(
        self,
        offer: Offer,
        count: int,
        request_id: str,
        *,
        tags: Mapping[str, str],
        job: JobSpec | None = None,
    ) -> list[Instance]:
        require_count(f"{self.name} (dry-run)", offer, count, request_id)
        duration_h = job.request.duration_hours if job is not None else DEFAULT_DURATION_HOURS
        with self._lock:
            if request_id in self._by_request:
                return [self._state(self._runs[i]) for i in self._by_request[request_id]]
            now = self._clock.now()
            digest = hashlib.sha256(request_id.encode()).hexdigest()[:10]
            all_tags = launch_tags(tags, request_id) | {TAG_DRY_RUN: "true"}
            ids = []
            # a warm pool's instance is up until terminated; work runs on it with run_on
            ends = datetime.max.replace(tzinfo=now.tzinfo) if TAG_POOL in tags else \
                now + timedelta(hours=max(0.0, duration_h))
            for n in range(count):
                iid = f"dry-{self.name}-{digest}-{n}"
                inst = offer_instance(iid, self.name, offer, all_tags, launched_at=now, dry_run=True)
                self._runs[iid] = _Run(inst, ends)
                ids.append(iid)
            self._by_request[request_id] = ids
            return [self._state(self._runs[i]) for i in ids]

    def _state(self, run: _Run) -> Instance:
        if run.terminated:
            state, code = InstanceState.TERMINATED, None
        elif self._clock.now() >= run.ends_at:
            state, code = InstanceState.SUCCEEDED, 0
        else:
            state, code = InstanceState.RUNNING, None
        return dataclasses.replace(run.instance, state=state, exit_code=code)

    def instances(self, tags: Mapping[str, str] | None = None) -> list[Instance]:
        with self._lock:
            return [self._state(r) for r in self._runs.values() if matches_tags(r.instance.tags, tags)]

    def run_on(self, instance_id: str, request_id: str, *, tags: Mapping[str, str],
               job: JobSpec | None = None) -> Instance:
        """Run a job on running instance ``instance_id`` for its duration estimate (see the module docstring);
        idempotent per ``request_id``. Raises ``ProviderError`` when the instance is not running."""
        duration_h = job.request.duration_hours if job is not None else DEFAULT_DURATION_HOURS
        rid = run_id(instance_id, request_id)
        with self._lock:
            if rid in self._runs:
                return self._state(self._runs[rid])
            host = self._runs.get(instance_id)
            if host is None or self._state(host).state is not InstanceState.RUNNING:
                raise ProviderError(f"{self.name} (dry-run): instance {instance_id} is not running",
                                    provider=self.name, request_id=request_id)
            now = self._clock.now()
            inst = dataclasses.replace(host.instance, id=rid, launched_at=now,
                                       tags=launch_tags(tags, request_id) | {TAG_DRY_RUN: "true", TAG_ON: instance_id})
            self._runs[rid] = _Run(inst, now + timedelta(hours=max(0.0, duration_h)))
            self._by_request[request_id] = [rid]
            return self._state(self._runs[rid])

    def terminate(self, ids: Sequence[str], request_id: str) -> None:
        with self._lock:
            gone = set(ids)
            for iid in ids:
                run = self._runs.get(iid)
                if run is not None:
                    run.terminated = True
            for run in self._runs.values():  # the runs on a terminated instance end with it
                if run.instance.tags.get(TAG_ON) in gone:
                    run.terminated = True

    def poll_errors(self) -> list[ProviderError]:
        return []
