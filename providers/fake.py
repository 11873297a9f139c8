"""A real in-memory provider for tests, examples and benchmarks.

It accepts launches instantly and keeps instances in a dict; errors can be scripted (one entry per
launch call: an exception to raise, or ``None`` for success) or computed by a ``fail`` callable.
With ``leak_on_error=True`` a failing launch first creates its instances, like a cloud whose API
errors after a partial success, which lets tests prove that failover cleans up orphans by tag.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from broker.errors import ProviderError
from broker.model import Instance, InstanceState, JobSpec, Offer

from .base import Capability, launch_tags, matches_tags, offer_instance, require_count

__all__ = ["FakeProvider", "FailFn"]

FailFn = Callable[[Offer, int, str], ProviderError | None]
"""``fail(offer, count, request_id)`` returns the error a launch should raise, or ``None``."""


class FakeProvider:
    """An in-memory :class:`providers.base.Provider` (see the module docstring).

    ``fail`` is either a callable (:data:`FailFn`) or a script: an iterable of ``ProviderError | None``,
    one item consumed per launch call (an exhausted script means success). ``launch_calls`` records every
    ``(offer, count, request_id)`` received, ``terminated`` every id terminated.
    """

    def __init__(
        self,
        name: str = "fake",
        *,
        offers: Iterable[Offer] = (),
        fail: FailFn | Iterable[ProviderError | None] | None = None,
        leak_on_error: bool = False,
        capabilities: frozenset[Capability] | None = None,
    ) -> None:
        self.name = name
        # RUNS_WORK: tests end its instances themselves (succeeded/failed with an exit code)
        self.capabilities = capabilities or frozenset(
            {Capability.SPOT, Capability.GPUS, Capability.MULTI_NODE, Capability.TAGS, Capability.RUNS_WORK}
        )
        self._offers = list(offers)
        self._fail_fn: FailFn | None = fail if callable(fail) else None
        self._script: list[ProviderError | None] = [] if fail is None or callable(fail) else list(fail)
        self._leak = leak_on_error
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._by_id: dict[str, Instance] = {}
        self._by_request: dict[str, list[str]] = {}
        self._errors: list[ProviderError] = []
        self.launch_calls: list[tuple[Offer, int, str]] = []
        self.terminated: list[str] = []

    def offers(self) -> list[Offer]:
        return list(self._offers)

    def _next_error(self, offer: Offer, count: int, request_id: str) -> ProviderError | None:
        if self._fail_fn is not None:
            return self._fail_fn(offer, count, request_id)
        return self._script.pop(0) if self._script else None

    def launch(
        self,
        offer: Offer,
        count: int,
        request_id: str,
        *,
        tags: Mapping[str, str],
        job: JobSpec | None = None,
    ) -> list[Instance]:
        require_count(self.name, offer, count, request_id)
        with self._lock:
            self.launch_calls.append((offer, count, request_id))
            existing = self._by_request.get(request_id)
            if existing:
                return [self._by_id[i] for i in existing]
            error = self._next_error(offer, count, request_id)
            if error is not None and not self._leak:
                raise _stamp(error, self.name, offer.region, request_id)
            made = []
            for _ in range(count):
                iid = f"{self.name}-{next(self._ids):06d}"
                inst = offer_instance(iid, self.name, offer, launch_tags(tags, request_id))
                self._by_id[iid] = inst
                made.append(inst)
            if error is not None:  # partial success then an error: the instances stay (orphans)
                raise _stamp(error, self.name, offer.region, request_id)
            self._by_request[request_id] = [i.id for i in made]
            return made

    def instances(self, tags: Mapping[str, str] | None = None) -> list[Instance]:
        with self._lock:
            return [i for i in self._by_id.values() if matches_tags(i.tags, tags)]

    def terminate(self, ids: Sequence[str], request_id: str) -> None:
        with self._lock:
            for iid in ids:
                inst = self._by_id.get(iid)
                if inst is None or inst.state is InstanceState.TERMINATED:
                    continue
                self._by_id[iid] = dataclasses.replace(inst, state=InstanceState.TERMINATED)
                self.terminated.append(iid)

    def running(self) -> list[Instance]:
        """Instances not terminated (what would cost money)."""
        return [i for i in self.instances() if i.state is not InstanceState.TERMINATED]

    def inject_error(self, error: ProviderError) -> None:
        """Queue an asynchronous error for :meth:`poll_errors` (e.g. a spot reclaim)."""
        with self._lock:
            self._errors.append(error)

    def poll_errors(self) -> list[ProviderError]:
        with self._lock:
            out, self._errors = self._errors, []
            return out


def _stamp(error: ProviderError, provider: str, region: str, request_id: str) -> ProviderError:
    error.provider = error.provider or provider
    error.region = error.region or region
    error.request_id = error.request_id or request_id
    return error

