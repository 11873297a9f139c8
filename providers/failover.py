"""Provisioning with failover: try a placement and its ranked alternatives in order.

* ``CapacityError`` -> block that offer (provider, region, instance type, capacity kind) for
  ``capacity_block_seconds`` and move on to the next option;
* ``QuotaError`` -> block the whole region of that provider for ``quota_block_seconds`` and move on;
* ``TransientError`` -> retry the same option after ``min(max_retry_delay, retry_delay * 2**n) * jitter``
  seconds (``jitter`` uniform in [0.5, 1.0], slept on the injected clock), or after the provider's
  ``Retry-After`` when that is longer (``retry_after`` of the error); at most ``retry.backoff_limit`` retries
  per option. Past the limit, or when ``Retry-After`` asks for more than ``max_retry_delay``, the offer is
  blocked for that long and the **next option** is tried (the call gives up only when every option failed);
* a job with a command is never launched on a provider without :attr:`Capability.RUNS_WORK` (nor
  ``DRY_RUN``): such options are recorded ``invalid`` and skipped;
* ``AuthError`` -> stop at once (retrying or failing over with the same credentials will not help);
* ``InvalidRequestError`` -> this option cannot work as asked; move on without retrying.

When no option launched and every option was really tried (none skipped for a block that an *earlier* call
set, which may expire), the outcome is ``exhausted``: the broker then fails the job with
:func:`exhausted_reason` instead of backing it off to try the same list again.

Every attempt is returned as an :class:`broker.model.Attempt`. When the call gives up, everything created
for ``request_id`` on any provider touched (found by the ``hb-request`` tag) is terminated, so nothing is
orphaned; on success, instances left by *other* failed options of the same request are terminated too.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from broker.clock import Clock
from broker.errors import (
    AuthError,
    CapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaError,
    TransientError,
)
from broker.model import Attempt, Instance, JobSpec, PlacementOption, RetryPolicy

from .base import TAG_REQUEST, Capability, Provider, offer_from_option
from .errors import map_exception

__all__ = ["Blocklist", "ProvisionOutcome", "provision", "backoff_delay", "exhausted_reason"]



class Blocklist:
    """Offers and regions to avoid until a time, on a clock (thread-safe).

    Keys are ``(provider, region, instance_type, capacity)`` for offers and ``(provider, region)`` for
    regions. Expired entries are ignored and dropped lazily. Share one Blocklist between calls so a
    capacity error seen for one job steers the next job away too.
    """

    def __init__(
        self, clock: Clock, *, capacity_block_seconds: float = 300.0, quota_block_seconds: float = 1800.0
    ) -> None:
        self.clock = clock
        self.capacity_block_seconds = capacity_block_seconds
        self.quota_block_seconds = quota_block_seconds
        self._until: dict[tuple[str, ...], tuple[datetime, str]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def offer_key(option: PlacementOption) -> tuple[str, ...]:
        return (option.provider, option.region, option.instance_type, option.capacity)

    @staticmethod
    def region_key(option: PlacementOption) -> tuple[str, ...]:
        return (option.provider, option.region)

    def block(self, key: tuple[str, ...], seconds: float, reason: str) -> None:
        with self._lock:
            until = self.clock.now() + timedelta(seconds=seconds)
            old = self._until.get(key)
            if old is None or old[0] < until:
                self._until[key] = (until, reason)

    def block_offer(self, option: PlacementOption, reason: str) -> None:
        self.block(self.offer_key(option), self.capacity_block_seconds, reason)

    def block_region(self, option: PlacementOption, reason: str) -> None:
        self.block(self.region_key(option), self.quota_block_seconds, reason)

    def reason(self, option: PlacementOption) -> str | None:
        """Why ``option`` is blocked now (offer first, then region), or ``None`` when it is not."""
        now = self.clock.now()
        with self._lock:
            for key in (self.offer_key(option), self.region_key(option)):
                hit = self._until.get(key)
                if hit is None:
                    continue
                if hit[0] <= now:
                    del self._until[key]
                    continue
                return hit[1]
        return None

    def entries(self) -> dict[tuple[str, ...], datetime]:
        """Keys blocked now, with their expiry."""
        now = self.clock.now()
        with self._lock:
            return {k: v[0] for k, v in self._until.items() if v[0] > now}


@dataclass(frozen=True)
class ProvisionOutcome:
    """The result of :func:`provision`: the instances and the option that got them (``option`` is ``None``
    and ``error`` set when every option failed), and every attempt in order. ``exhausted`` is true when no
    option launched although every one was tried (see the module docstring)."""

    instances: list[Instance]
    option: PlacementOption | None
    attempts: list[Attempt] = field(default_factory=list)
    error: ProviderError | None = None
    exhausted: bool = False

    @property
    def ok(self) -> bool:
        return self.option is not None and self.error is None


def backoff_delay(retry: RetryPolicy, n: int, rng: random.Random) -> float:
    """Seconds to wait before retry number ``n`` (0-based): ``min(max, base * 2**n) * U[0.5, 1.0]``."""
    base = min(retry.max_retry_delay_seconds, retry.retry_delay_seconds * (2.0 ** min(n, 60)))
    return base * rng.uniform(0.5, 1.0)


def exhausted_reason(attempts: Sequence[Attempt]) -> str:
    """One line saying why every option failed, option by option in the order tried:
    ``every placement option failed: aws:us-east-1 m5.large on-demand: 3 transient errors (gave up after 2
    retries): <last message>; ...``."""
    by: dict[tuple[str, str, str, str], list[Attempt]] = {}
    for a in attempts:
        by.setdefault((a.provider, a.region, a.instance_type, a.capacity), []).append(a)
    parts = []
    for (provider, region, itype, capacity), got in by.items():
        last = got[-1]
        kinds = [a.outcome for a in got]
        count = f"{len(kinds)} {last.outcome} errors" if len(kinds) > 1 else f"{last.outcome} error"
        parts.append(f"{provider}:{region} {itype} {capacity}: {count}: {last.message[:240]}")
    return f"every placement option failed ({len(by)} tried): " + "; ".join(parts)


def provision(
    options: Sequence[PlacementOption],
    get_provider: Callable[[str], Provider],
    *,
    request_id: str,
    tags: Mapping[str, str],
    job: JobSpec | None,
    retry: RetryPolicy,
    clock: Clock,
    blocklist: Blocklist | None = None,
    rng: random.Random | None = None,
    count: int = 1,
    wait_budget_seconds: float | None = None,
) -> ProvisionOutcome:
    """Provision ``count`` instances on the first option that works (see the module docstring).

    ``wait_budget_seconds`` bounds the time this call sleeps between transient retries (``None``: no bound):
    a retry whose delay would go past it is not waited for here; the offer is blocked for that delay and the
    next option is tried, and such an option does not count as tried for :attr:`ProvisionOutcome.exhausted`
    (the caller's later attempt, after the block, continues it).

    ``tags`` should carry ``hb-job``; ``hb-request`` is set to ``request_id``. The same ``request_id`` is
    passed to every option's launch, so a retried call after a crash stays idempotent per provider.
    Never raises a ``ProviderError``: failures come back in ``error`` with every attempt recorded.
    """
    blocks = blocklist if blocklist is not None else Blocklist(clock)
    rand = rng if rng is not None else random.Random()
    all_tags = dict(tags) | {TAG_REQUEST: request_id}
    attempts: list[Attempt] = []
    touched: dict[str, Provider] = {}  # providers where a launch failed: the ones that may hold orphans
    last_error: ProviderError | None = None
    mine: set[tuple[str, ...]] = set()  # offers/regions blocked by this call (their skips count as tried)
    waited_out = False  # an option was skipped for an earlier call's block: the list is not exhausted
    waited = 0.0  # seconds slept between retries in this call (against ``wait_budget_seconds``)

    def record(option: PlacementOption, outcome: str, message: str = "", delay: float = 0.0,
               retryable: bool = False) -> None:
        attempts.append(
            Attempt(
                provider=option.provider,
                region=option.region,
                instance_type=option.instance_type,
                capacity=option.capacity,
                outcome=outcome,
                message=message,
                at=clock.now(),
                delay_seconds=delay,
                retryable=retryable,
            )
        )

    for option in options:
        why = blocks.reason(option)
        if why is not None:
            record(option, "skipped", f"blocked: {why}")
            waited_out |= not ({blocks.offer_key(option), blocks.region_key(option)} & mine)
            continue
        try:
            provider = get_provider(option.provider)
        except ProviderError as exc:
            last_error = exc
            record(option, exc.kind, str(exc), retryable=exc.retryable)
            if isinstance(exc, AuthError):
                break
            continue
        caps: frozenset[Capability] = getattr(provider, "capabilities", frozenset())
        if job is not None and job.command and not ({Capability.RUNS_WORK, Capability.DRY_RUN} & set(caps)):
            last_error = InvalidRequestError(
                f"{option.provider} cannot run a job's command (no {Capability.RUNS_WORK.value} capability). "
                "To fix: place the job on a provider that runs work (aws, azure, gcp, onprem, edge).",
                provider=option.provider, region=option.region, request_id=request_id)
            record(option, "invalid", str(last_error))
            continue
        offer = offer_from_option(option)
        retries_used = 0
        while True:
            try:
                got = provider.launch(offer, count, request_id, tags=all_tags, job=job)
            except Exception as raw:  # noqa: BLE001 - adapters should map, but never trust it
                err = map_exception(raw, option.provider, option.region, request_id)
                if err is None:
                    err = ProviderError(
                        f"{option.provider}:{option.region}: unexpected {type(raw).__name__}: {raw}. "
                        "To fix: report this adapter bug; the broker treats it as a failed option.",
                        provider=option.provider,
                        region=option.region,
                        request_id=request_id,
                    )
                last_error = err
                touched[option.provider] = provider
                if isinstance(err, TransientError):
                    after = float(getattr(err, "retry_after", None) or 0.0)
                    if retries_used >= retry.backoff_limit or after > retry.max_retry_delay_seconds:
                        why = (f"Retry-After {after:g}s is over the {retry.max_retry_delay_seconds:g}s cap"
                               if after > retry.max_retry_delay_seconds else f"gave up after {retries_used} retries")
                        record(option, "transient", f"{err} ({why}; trying the next option)", retryable=True)
                        blocks.block(blocks.offer_key(option), max(after, retry.max_retry_delay_seconds),
                                     f"transient errors: {err}")
                        mine.add(blocks.offer_key(option))
                        _cleanup_provider(provider, request_id, keep=())
                        break
                    delay = max(backoff_delay(retry, retries_used, rand), after)
                    if wait_budget_seconds is not None and waited + delay > wait_budget_seconds:
                        record(option, "transient", f"{err} (its retry in {delay:.3g}s is past this call's "
                               f"{wait_budget_seconds:g}s wait budget: the offer is blocked until then and the "
                               "next option is tried)", delay=delay, retryable=True)
                        blocks.block(blocks.offer_key(option), delay, f"transient errors, retry due: {err}")
                        waited_out = True
                        _cleanup_provider(provider, request_id, keep=())
                        break
                    retries_used += 1
                    waited += delay
                    record(option, "transient", str(err), delay=delay, retryable=True)
                    clock.sleep(delay)
                    continue
                record(option, err.kind, str(err), retryable=err.retryable)
                if isinstance(err, CapacityError):
                    blocks.block_offer(option, str(err))
                    mine.add(blocks.offer_key(option))
                elif isinstance(err, QuotaError):
                    blocks.block_region(option, str(err))
                    mine.add(blocks.region_key(option))
                elif isinstance(err, AuthError):
                    return _abandon(touched, request_id, attempts, err)
                elif isinstance(err, InvalidRequestError):
                    pass
                _cleanup_provider(provider, request_id, keep=())
                break
            else:
                record(option, "launched", f"{len(got)} instance(s): {', '.join(i.id for i in got)}")
                keep = {i.id for i in got}
                for name, other in touched.items():
                    _cleanup_provider(other, request_id, keep=keep if name == option.provider else ())
                return ProvisionOutcome(instances=got, option=option, attempts=attempts, error=None)

    if last_error is None:
        last_error = CapacityError(
            "no placement option could be tried (all blocked or none given). To fix: wait for the blocks "
            "to expire, or widen the job's placement (providers, regions, spot).",
            request_id=request_id,
        )
        waited_out = True
    out = _abandon(touched, request_id, attempts, last_error)
    return dataclasses.replace(out, exhausted=not waited_out and not isinstance(last_error, AuthError))


def _cleanup_provider(provider: Provider, request_id: str, keep: Sequence[str] | set[str]) -> None:
    """Terminate every live instance tagged with ``request_id`` on ``provider`` except ``keep``."""
    try:
        found = provider.instances({TAG_REQUEST: request_id})
        # stopped/ended ones too: a stopped GCE or Azure VM still bills its disk until it is deleted
        # (terminate is idempotent: an instance that is already gone is skipped by the adapter)
        ids = [i.id for i in found if i.id not in keep]
        if ids:
            provider.terminate(ids, f"{request_id}:cleanup")
    except Exception:  # noqa: BLE001 - cleanup is best effort; the broker reconciles by tag later
        return


def _abandon(
    touched: Mapping[str, Provider], request_id: str, attempts: list[Attempt], error: ProviderError
) -> ProvisionOutcome:
    for provider in touched.values():
        _cleanup_provider(provider, request_id, keep=())
    return ProvisionOutcome(instances=[], option=None, attempts=attempts, error=error)
