"""The scheduler loop: takes pending jobs in queue order, admits, places, provisions, polls and requeues.

One cycle (:meth:`Scheduler.run_cycle`) reads as numbered steps, each timed (``hb_scheduler_cycle_seconds``)
and logged at DEBUG:

0. **cancels**: cancels requested through a replica that could not stop the run (an on-prem run of another
   machine) are carried out: the run is stopped, its final log tails stored, then the job is CANCELLED
   (:func:`broker.job_logs.carry_out_cancels`; other replicas carry out those of the on-prem runs they know).
1. **heads**: PENDING jobs whose ``not_before`` has passed, ordered by the queue disciplines of
   :mod:`broker.queues` (per namespace: fifo | priority | fair-share | edf | default, merged across
   namespaces by the cluster discipline; ``default`` is :func:`queue_key`: priority, deadline, age, id).
2. **snapshot**: on-prem free capacity per host, extra offers (edge devices), active usage per namespace.
3. **admit**: every check of :attr:`Scheduler.admission_checks` (``(job, snapshot) -> None | reason``;
   :func:`broker.app.create_app` appends :class:`broker.policy_store.PolicyAdmission`: quotas, budgets,
   priority classes, reservations); a held job stays PENDING with ``held_reason`` set and one note event
   per new reason; a reason for which :func:`policies.deadline.is_terminal` holds fails the job at once.
4. **place**: on-prem first while its host has room (and the deadline allows), else the cheapest cloud
   option meeting the deadline (its premium over the cheapest option is recorded); an on-prem-only job
   that finds no room may **preempt** lower-priority on-prem runs (:func:`policies.preemption.find_victims`;
   SIGTERM with a grace period so they checkpoint; RUNNING -> PENDING ``Preempted by <job>``).
   **Gangs** (``nodes: N``) get all N or nothing (:func:`policies.gang.place_gang`): over on-prem hosts
   (one site with ``sameZone``), else one cloud launch of N in one zone (``sameZone``) or spread over
   zones (``BROKER_GANG_SPREAD``). **Load balancing**: among options equivalent in total cost (within
   ``BROKER_LOAD_BALANCING_TOLERANCE``) the plugin of ``BROKER_LOAD_BALANCING`` picks
   (:func:`policies.loadbalance.choose_pool`, fed from the store); the choice is in the PLACED event.
   PENDING -> PLACED -> PROVISIONING with one bulk insert of decision records, in one transaction per
   batch. Nothing feasible anywhere -> FAILED.
5. **provision**: :func:`providers.failover.provision` over the chosen option and its alternatives, in
   waves of ``BROKER_SCHEDULER_LAUNCH_CONCURRENCY`` launches at once (1 by default: one after another), with
   the job's ``spec.retry`` for the in-cycle retries of transient errors (per option: at most ``backoffLimit``
   retries, delays doubling from ``retryDelaySeconds`` up to ``maxRetryDelaySeconds``, or the provider's
   ``Retry-After``, slept on the scheduler's clock, at most ``BROKER_LAUNCH_RETRY_WAIT_SECONDS`` per job in
   all: a longer delay blocks the offer and the next option is tried); PROVISIONING -> RUNNING, FAILED when
   every option was tried and failed (the message says why, option by option), else BACKOFF (retryable,
   within ``backoffLimit``) / FAILED. A shutdown ends a retry wait at once and leaves the job PROVISIONING
   for the next start's reconciliation. A gang over several
   hosts or zones is one launch per part (all tagged with the job's request id); fewer than N instances,
   or a part failing, terminates everything launched for it and backs off.
6. **poll**: running instances' states -> SUCCEEDED / FAILED / BACKOFF (retry) and terminate leftovers
   (edge jobs: their device task states from the store, :meth:`broker.edge_provider.EdgeRunner.sweep`);
   with the terminal transition, in its transaction: the decision record's outcome, the budget ledger's
   actual-minus-estimate, and the namespace's fair-share usage. On-prem runs' log tails are stored for the
   other replicas (:class:`broker.job_logs.LogCapture`: while running when they grew, and at the end). A job
   whose cancel was requested is left to step 0.
7. **requeue**: BACKOFF jobs whose delay has passed -> PENDING.

The store is the truth: a restarted scheduler rebuilds everything from it, and :meth:`Scheduler.reconcile`
(run at start and at every new leadership term) adopts or terminates instances by their
``hb-job``/``hb-request`` tags, so nothing leaks. Rows are claimed with ``SELECT ... FOR UPDATE SKIP LOCKED``
on PostgreSQL, and only the holder of the advisory lock :data:`LEADER_LOCK_ID` runs cycles, so several broker
processes can share one database. Leadership is fenced (:mod:`broker.leader`): the lock is checked at every
cycle and before every wave of launches (step 5), and every write transaction of the scheduler
(:meth:`Scheduler._tx`) is refused once another replica's term has begun.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from broker.errors import ProviderError, SpecError
from broker.job_logs import LogCapture, carry_out_cancels, instance_ids
from broker.leader import TAKEOVER_GRACE_SECONDS, FencedOut, Leadership
from broker.lifecycle import Transition, apply_transitions, note
from broker.model import (
    Attempt,
    Instance,
    InstanceState,
    JobSpec,
    JobState,
    Offer,
    PlacementOption,
    PlacementResult,
    Request,
    RetryPolicy,
)
from broker.spec_cache import SpecCache
from broker.store import AttemptRow, JobRow, utc
from policies.gang import SPREAD, GangPlacement, Slot, place_gang
from policies.loadbalance import Context as LBContext
from policies.loadbalance import Pool as LBPool
from policies.loadbalance import choose_pool
from policies.placement.deadline import equivalent_request
from policies.queueing import UsageVector
from policies.workload import Resources, Workload
from providers.base import TAG_ON, TAG_POOL

__all__ = [
    "Scheduler",
    "QueuedJob",
    "Snapshot",
    "CycleReport",
    "AdmissionCheck",
    "queue_key",
    "LEADER_LOCK_ID",
    "TAG_JOB",
    "TAG_REQUEST",
    "TAG_NAMESPACE",
    "job_backoff_seconds",
]

log = logging.getLogger("broker.scheduler")

LEADER_LOCK_ID = 0x6862_5343  # "hbSC": the advisory lock of the scheduler leader on PostgreSQL
TAG_JOB = "hb-job"
TAG_REQUEST = "hb-request"
TAG_NAMESPACE = "hb-namespace"
LOST_INSTANCE_GRACE_SECONDS = 60.0
ACTIVE_STATES = (JobState.PLACED.value, JobState.PROVISIONING.value, JobState.RUNNING.value)

_jobs = JobRow.__table__  # type: ignore[attr-defined]
_attempts = AttemptRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class QueuedJob:
    """A pending job as the queue ordering and admission checks see it."""

    id: str
    namespace: str
    name: str
    priority: int
    created_at: datetime
    spec: JobSpec
    retries: int
    held_reason: str | None
    request_id: str | None = None  # of the previous run (a new run after a preemption gets a new one)

    @property
    def request(self) -> Request:
        return self.spec.request

    @property
    def deadline(self) -> datetime | None:
        return self.spec.request.deadline


@dataclass
class Snapshot:
    """Capacity at the start of a cycle. ``onprem_free`` maps host -> free ``vcpus``/``memory_gib``/``gpus``;
    ``usage`` maps namespace -> summed ``vcpus``/``memory_gib``/``gpus``/``jobs`` of its active jobs.
    :meth:`reserve` books on-prem room for jobs placed earlier in the same cycle."""

    now: datetime
    onprem_free: dict[str, dict[str, float]] = field(default_factory=dict)
    extra_offers: list[Offer] = field(default_factory=list)
    usage: dict[str, dict[str, float]] = field(default_factory=dict)

    def fits(self, host: str, vcpus: float, memory_gib: float, gpus: int) -> bool:
        free = self.onprem_free.get(host)
        if free is None:
            return True  # unknown host: let the pool decide at launch
        return (
            free["vcpus"] + 1e-9 >= vcpus and free["memory_gib"] + 1e-6 >= memory_gib and free["gpus"] >= gpus
        )

    def reserve(self, host: str, vcpus: float, memory_gib: float, gpus: int) -> None:
        free = self.onprem_free.get(host)
        if free is not None:
            free["vcpus"] -= vcpus
            free["memory_gib"] -= memory_gib
            free["gpus"] -= gpus


AdmissionCheck = Callable[[QueuedJob, Snapshot], "str | None"]


@dataclass
class CycleReport:
    """What one cycle did (counts) and how long each step took (seconds)."""

    heads: int = 0
    held: int = 0
    placed: int = 0
    failed: int = 0
    provisioned: int = 0
    backoff: int = 0
    finished: int = 0
    requeued: int = 0
    preempted: int = 0
    cancelled: int = 0  # cancels requested through another replica, carried out here
    step_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def busy(self) -> bool:
        return bool(self.placed or self.failed or self.finished or self.requeued or self.preempted
                    or self.cancelled)


def _default_queue_key(job: QueuedJob) -> tuple[int, float, float, str]:
    """1. higher priority  2. earlier deadline  3. older  4. id."""
    deadline = job.deadline.timestamp() if job.deadline else float("inf")
    return (-job.priority, deadline, job.created_at.timestamp(), job.id)


_policy_queue_key: Callable[[Any], Any] | None
try:  # the policies area owns the ordering; ours is the same default until it exists
    from policies.queueing import queue_key as _policy_queue_key
except ImportError:  # pragma: no cover - depends on what is installed
    _policy_queue_key = None


def queue_key(job: QueuedJob) -> Any:
    """The queue order: ``policies.queueing.queue_key`` when available, else priority/deadline/age/id."""
    if _policy_queue_key is not None:
        return _policy_queue_key(job)
    return _default_queue_key(job)


def job_backoff_seconds(retry: RetryPolicy, retries: int) -> float:
    """Delay before retry number ``retries`` (0-based): ``min(max, base * 2**retries)`` (deterministic)."""
    return min(retry.max_retry_delay_seconds, retry.retry_delay_seconds * (2.0 ** min(retries, 60)))


def _instances_json(instances: Iterable[Instance]) -> str:
    return json.dumps(
        [{"id": i.id, "provider": i.provider, "region": i.region, "instance_type": i.instance_type,
          "dry_run": i.dry_run} for i in instances]
    )


_instance_ids = instance_ids  # one parser of a row's instances_json (broker.job_logs)


WAIT_ONPREM = "waiting for on-prem capacity"
PREEMPTED_BY = "Preempted by"


def _last_checkpoint(spec: JobSpec) -> datetime | None:
    """When the job last wrote to its ``checkpoint.path`` (newest file mtime, UTC), or ``None``."""
    if spec.checkpoint is None or not spec.checkpoint.path:
        return None
    try:
        with os.scandir(spec.checkpoint.path) as it:
            stamps = [e.stat().st_mtime for e in it if e.is_file()]
    except OSError:
        return None
    return datetime.fromtimestamp(max(stamps), UTC) if stamps else None


def _is_after_preemption(request_id: str | None, base: str) -> bool:
    return (request_id is not None and len(request_id) == len(base) + 4 and request_id.startswith(base)
            and request_id[len(base):].isdigit())


def _next_request_id(job: QueuedJob) -> str:
    """The provider request id of the job's next run: ``<job>-r<retries>``, or the id a preemption set
    for it (``<job>-r<retries><n:04d>``: still ``<job>-r<digits>``, which the edge provider parses, and
    never equal to a plain one since retries stay <= 100), so the provider's per-request idempotency does
    not hand back the stopped run."""
    base = f"{job.id}-r{job.retries}"
    return job.request_id if _is_after_preemption(job.request_id, base) and job.request_id else base


def _preempted_request_id(job_id: str, retries: int, previous: str | None) -> str:
    """The request id of a preempted job's next run (see :func:`_next_request_id`)."""
    base = f"{job_id}-r{retries}"
    n = int(previous[len(base):]) + 1 if previous and _is_after_preemption(previous, base) else 1
    return f"{base}{n:04d}"


def _victims(job: QueuedJob, stopped: list[dict[str, Any]]) -> str:
    """The preempted jobs as the preemptor's event names them: ids of its own namespace only."""
    own = [v["row"].id for v in stopped if v["row"].namespace == job.namespace]
    others = len(stopped) - len(own)
    return ", ".join(own + ([f"{others} job(s) of other namespaces"] if others else []))


def _estimate_usd(placement_json: str | None) -> float:
    """The ``total_usd`` of a stored placement (what budgets counted for it), 0 without one."""
    if not placement_json:
        return 0.0
    try:
        return float(json.loads(placement_json).get("total_usd", 0.0))
    except (ValueError, TypeError, AttributeError):
        return 0.0


def _run_cost(placement_json: str | None, hours: float, nodes: int) -> float:
    """What a run of ``hours`` on the stored placement cost: ``hourly_usd * nodes * hours + egress_usd``."""
    if not placement_json:
        return 0.0
    try:
        opt = json.loads(placement_json)
        return float(opt.get("hourly_usd", 0.0)) * nodes * max(0.0, hours) + float(opt.get("egress_usd", 0.0))
    except (ValueError, TypeError, AttributeError):
        return 0.0


# --- gang jobs and load balancing --------------------------------------------------------------------
ZONE_CACHE_SECONDS = 600.0  # how long the zones a provider's offers list are reused
LB_HISTORY_RUNS = 50  # measured runtimes per pool the performance/predictive plugins read
KEPT_PLACEMENTS = 4096  # placements of deadline-free requests kept across cycles (least recently used go)


def _pool_name(option: PlacementOption) -> str:
    """The load-balancing pool of an option: ``onprem:<host>`` for an on-prem host, else
    ``<provider>:<region>`` (the ``provider``/``region`` columns of the jobs table)."""
    return f"onprem:{option.instance_type}" if option.provider == "onprem" else f"{option.provider}:{option.region}"


def _nodes_that_fit(free: dict[str, float] | None, request: Request) -> int:
    """How many nodes of ``request`` a host with ``free`` capacity holds now (0 for an unknown host)."""
    if free is None:
        return 0
    n = float("inf")
    for want, have in ((request.vcpus, free["vcpus"]), (request.memory_gib, free["memory_gib"]),
                       (float(request.gpus), free["gpus"])):
        if want > 0:
            n = min(n, (have + 1e-9) // want)
    return int(max(0.0, min(n, 10_000.0)))


def _option_dict(option: PlacementOption) -> dict[str, Any]:
    d = option.to_dict()
    d["site"] = option.site
    d["finish_hours"] = option.finish_hours
    d["arch"] = option.arch
    return d


def _option_json(option: PlacementOption, extra: dict[str, str] | None = None) -> str:
    """The stored placement of ``option`` (with a warm pool's binding ``extra``: pool, pool_instance). Kept
    placements' options recur in every cycle, so their JSON is kept beside them (:func:`_option_memo`)."""
    if extra:
        return json.dumps(_option_dict(option) | extra)
    return str(_option_memo().get(option, lambda o: json.dumps(_option_dict(o))))


@functools.lru_cache(maxsize=1)
def _option_memo() -> Any:
    """The process's memo of option JSON (:class:`broker.decisions.JsonMemo`: by identity, bounded, LRU)."""
    from broker.decisions import JsonMemo

    return JsonMemo()


class _Stopping(Exception):
    """The scheduler loop was told to stop while a launch waited to be retried."""


class _RetryClock:
    """The clock of the in-cycle waits between launch retries: the scheduler's clock, except that a wait on the
    system clock ends as soon as the loop's ``stop`` is set, with :class:`_Stopping` (a shutdown does not sit
    out a backoff, nor retries hurried into failing the job). The job stays PROVISIONING; the next start's
    reconciliation adopts what was launched for it or requeues it, as after a crash."""

    def __init__(self, clock: Any, stop: threading.Event | None) -> None:
        self.clock = clock
        self.stop = stop

    def now(self) -> datetime:
        return self.clock.now()  # type: ignore[no-any-return]

    def monotonic(self) -> float:
        return float(self.clock.monotonic())

    def sleep(self, seconds: float) -> None:
        from broker.clock import SystemClock

        if self.stop is not None and isinstance(self.clock, SystemClock):
            if self.stop.wait(max(0.0, seconds)):
                raise _Stopping()
            return
        self.clock.sleep(seconds)
        if self.stop is not None and self.stop.is_set():
            raise _Stopping()


class Scheduler:
    """The scheduling loop of one broker app (``state`` is its :class:`broker.app.AppState`).

    ``admission_checks`` is the admission hook (the policies area appends quota/budget checks).
    ``clock`` defaults to the app's clock; ``batch`` is the most jobs one cycle takes per step.
    """

    def __init__(
        self,
        state: Any,
        *,
        clock: Any = None,
        admission_checks: Sequence[AdmissionCheck] = (),
        batch: int | None = None,
    ) -> None:
        self.state = state
        self.store = state.store
        self.clock = clock or state.clock
        self.admission_checks: list[AdmissionCheck] = list(admission_checks)
        self.batch = batch or state.settings.scheduler_batch
        # Launches in flight at once in step 5 (BROKER_SCHEDULER_LAUNCH_CONCURRENCY; 1 = one after another).
        self.launch_concurrency: int = state.settings.launch_concurrency
        self.metrics = state.metrics
        self._spec_cache: SpecCache[JobSpec] = SpecCache()  # bounded; ended jobs are dropped (step 6)
        self.log_capture = LogCapture()  # tails of on-prem runs, stored for the other replicas (step 6)
        self.leader = Leadership(self.store, LEADER_LOCK_ID)  # lock checked every cycle, fenced writes
        self._reconciled = False
        self._outage: str | None = None  # the error of the cycle that failed first in a row (logged once)
        self._lock = threading.Lock()
        from providers.failover import Blocklist

        self.blocklist = Blocklist(self.clock)
        self.rng = random.Random()  # jitter of the in-cycle launch retries (tests seed it)
        self._stop: threading.Event | None = None  # run_forever's: ends in-cycle retry waits on shutdown
        # Edge devices (broker.edge_provider.EdgeService), set by install_edge when the gateway runs:
        # per-job device offers in step 4, device task states in step 6.
        self.edge: Any = None
        # Preemption: seconds a stopped on-prem run gets to checkpoint after SIGTERM (None: the pool's).
        self.preemption_grace_seconds: float | None = None
        # Per cycle only (rebuilt from the store each cycle): placements by request, budget alerts.
        self._placements: dict[Any, PlacementResult] = {}
        # Placements of requests without a deadline kept across cycles (see _result), bounded, and what
        # step 4 needs to add the savings baselines to a recorded placement.
        self._kept_placements: collections.OrderedDict[Any, list[Any]] = collections.OrderedDict()
        self._placement_inputs: tuple[Any, ...] = ()
        self._enabled: set[str] = set(state.providers)
        self._inputs: dict[str, tuple[Any, datetime, list[Offer]]] = {}
        self._cycle_baselines: dict[Any, Any] = {}
        self._keys: dict[Any, tuple[Any, Any]] = {}  # per cycle: (job, deadline, now, edge) -> its cache key
        self._decision_memo: Any = None  # broker.decisions.JsonMemo: JSON of the kept placements' parts
        self._alerts: list[tuple[str, str]] = []
        self._preempted = 0
        self._cycle_now: datetime = self.clock.now()
        self._cycle_extra: list[Offer] = []
        # --- gang jobs and load balancing (BROKER_GANG_SPREAD, BROKER_LOAD_BALANCING[_TOLERANCE]) ---
        settings = state.settings
        self.gang_policy: str = settings.gang_spread
        self.load_balancing: dict[str, float] = settings.load_balancing_weights
        self.load_balancing_tolerance: float = settings.load_balancing_tolerance
        self._rr_last: dict[tuple[str, ...], str] = {}  # round-robin cursor per group of pools (per process)
        self._zones: dict[str, tuple[float, list[Offer]]] = {}  # provider -> (when, its zone-level offers)
        # Per cycle only: gang plans of placed jobs (step 4 -> 5), event data per job, active jobs and
        # measured runtimes per pool (read from the store once per cycle).
        self._gang_plans: dict[str, list[tuple[PlacementOption, int]]] = {}
        self._notes: dict[str, dict[str, Any]] = {}
        self._lb_running: dict[str, int] | None = None
        self._lb_runtimes: dict[str, list[float]] = {}
        # --- end gang / load balancing ---
        # Fleet operations (issue 14, broker.ops.service): called with the cycle's time after step 7.
        self.cycle_hooks: list[Callable[[datetime], Any]] = []
        # Warm pools (broker.ops.warm.WarmPools, set by install_ops): jobs of a pool's namespace/queue go onto
        # its warm instances in step 4 and start there in step 5.
        self.warm: Any = None

    # ------------------------------------------------------------------------------ loop and leadership

    def run_forever(self, stop: threading.Event) -> None:
        """Run cycles every ``scheduler_interval_seconds`` until ``stop`` is set (immediately again while
        there is more work). Errors of one cycle do not stop the loop; a run of failing cycles (a database
        outage) is logged once when it starts and once when it ends."""
        interval = self.state.settings.scheduler_interval_seconds
        self._stop = stop
        while not stop.is_set():
            busy = False
            try:
                if self.is_leader():
                    if not self._reconciled:
                        self.reconcile()
                    report = self.run_cycle()
                    busy = report.busy
                else:  # cancels of on-prem runs this replica's pool runs (a former leader's, on this machine)
                    carry_out_cancels(self.state, leader=False, capture=self.log_capture)
                if self._outage is not None:
                    log.warning("scheduler cycles work again (after: %s)", self._outage)
                    self._outage = None
            except FencedOut as exc:
                log.warning("%s", exc)
            except sa.exc.SQLAlchemyError as exc:  # the database is away: once per outage, no traceback
                if self._outage is None:
                    self._outage = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    log.warning("scheduler cycle failed, the store is unreachable; retrying every %gs (%s)",
                                interval, self._outage)
            except Exception:  # noqa: BLE001 - the loop must survive; the store keeps the truth
                log.exception("scheduler cycle failed; retrying next interval")
            if not busy:
                stop.wait(interval)
        self.release_leadership()

    def is_leader(self) -> bool:
        """True when this process may schedule: always on SQLite; on PostgreSQL the holder of the advisory
        lock, checked on its own session every call (:class:`broker.leader.Leadership`). A new term makes
        the next cycle reconcile first (takeover)."""
        leads = self.leader.check()
        if leads and self.leader.new_term:
            self.leader.new_term = False
            self._reconciled = False
        return leads

    def release_leadership(self) -> None:
        self.leader.release()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Any]:
        """A write transaction of the scheduler, fenced: refused (:class:`FencedOut`) once another replica's
        term has begun (:meth:`broker.leader.Leadership.fence`)."""
        with self.store.tx() as session:
            self.leader.fence(session)
            yield session

    # ------------------------------------------------------------------------------ helpers

    def _spec(self, job_id: str, spec_json: str, created_at: datetime) -> JobSpec:
        spec = self._spec_cache.get(job_id)
        if spec is None:
            from broker.spec import parse_job_spec

            spec = parse_job_spec(json.loads(spec_json), now=created_at)
            self._spec_cache.put(job_id, spec, len(spec_json))
        return spec

    def _lock_rows(self, session: Any, ids: Sequence[str], state: JobState, *, cancelling: bool = True) -> set[str]:
        """Ids among ``ids`` still in ``state``, row-locked on PostgreSQL (``FOR UPDATE SKIP LOCKED``); without
        those whose cancel was requested when ``cancelling`` is False (the replica stopping them owns them)."""
        if not ids:
            return set()
        out: set[str] = set()
        for start in range(0, len(ids), 900):
            stmt = sa.select(_jobs.c.id).where(_jobs.c.id.in_(ids[start : start + 900]), _jobs.c.state == state.value)
            if not cancelling:
                stmt = stmt.where(_jobs.c.cancel_requested_at.is_(None))
            if self.store.is_postgres:
                stmt = stmt.with_for_update(skip_locked=True)
            out.update(session.execute(stmt).scalars())
        return out

    def _count(self, transitions: Iterable[Transition]) -> None:
        ended = []
        for t in transitions:
            self.metrics.transitions.labels(t.to_state.value).inc()
            if t.to_state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
                ended.append(t.job_id)
        self._spec_cache.discard(ended)  # an ended job's spec is not read again by the loop

    def _timed(self, report: CycleReport, step: str, started: float) -> None:
        took = time.perf_counter() - started
        report.step_seconds[step] = took
        self.metrics.cycle_seconds.labels(step).observe(took)

    # ------------------------------------------------------------------------------ the cycle

    def run_cycle(self) -> CycleReport:
        """One scheduling cycle (see the module docstring). Returns what it did."""
        with self._lock:
            report = CycleReport()
            now = self.clock.now()
            self._placements, self._alerts, self._preempted = {}, [], 0
            self._gang_plans, self._notes, self._lb_running, self._lb_runtimes = {}, {}, None, {}
            self._inputs, self._cycle_baselines, self._keys = {}, {}, {}
            self._check_placement_inputs()

            t0 = time.perf_counter()  # 0: cancels requested through replicas that could not stop the run
            report.cancelled = carry_out_cancels(self.state, leader=True, capture=self.log_capture,
                                                 fence=self.leader.fence)
            self._timed(report, "0-cancels", t0)

            t0 = time.perf_counter()
            heads, failed_parse = self._heads(now)
            self._timed(report, "1-heads", t0)
            report.heads = len(heads)

            t0 = time.perf_counter()
            snapshot = self._snapshot(now) if heads else Snapshot(now)
            if heads and self.warm is not None:
                self.warm.begin(now)
            self._timed(report, "2-snapshot", t0)

            t0 = time.perf_counter()
            admitted, holds, terminal = self._admit(heads, snapshot)
            report.held = len(holds)
            self._timed(report, "3-admit", t0)

            t0 = time.perf_counter()
            to_provision, failed = self._place(admitted, holds, snapshot, failed_parse + terminal, now, heads)
            report.placed = len(to_provision)
            report.failed = failed
            report.preempted = self._preempted
            self._timed(report, "4-place", t0)

            t0 = time.perf_counter()
            ok, backoff = self._provision(to_provision)
            report.provisioned, report.backoff = ok, backoff
            self._timed(report, "5-provision", t0)

            t0 = time.perf_counter()
            report.finished = self._poll(self.clock.now())
            self._timed(report, "6-poll", t0)

            t0 = time.perf_counter()
            report.requeued = self._requeue(self.clock.now())
            self._timed(report, "7-requeue", t0)
            self._sweep(self.clock.now())  # orphans of no active job (providers/sweeper.py), when due
            for hook in self.cycle_hooks:  # fleet operations (broker.ops.service); never stops the cycle
                try:
                    hook(self.clock.now())
                except Exception:  # noqa: BLE001
                    log.exception("cycle hook %r failed", hook)
            if report.busy or report.held:
                log.debug("cycle %s", report)
            return report

    # 1 ---------------------------------------------------------------------------------------------
    def _heads(self, now: datetime) -> tuple[list[QueuedJob], list[tuple[str, str]]]:
        stmt = (
            sa.select(_jobs.c.id, _jobs.c.namespace, _jobs.c.name, _jobs.c.priority, _jobs.c.created_at,
                      _jobs.c.spec_json, _jobs.c.retries, _jobs.c.held_reason, _jobs.c.request_id)
            .where(_jobs.c.state == JobState.PENDING.value,
                   sa.or_(_jobs.c.not_before.is_(None), _jobs.c.not_before <= now))
            .order_by(_jobs.c.priority.desc(), _jobs.c.id)
            .limit(self.batch)
        )
        from broker import queues

        with self.store.read() as session:
            rows = list(session.execute(stmt))
            config = queues.load_queue_config(session) if rows else queues.QueueConfig()
            usage = queues.load_usage(session, config.half_life_seconds) if config.uses_fair_share else None
        heads: list[QueuedJob] = []
        bad: list[tuple[str, str]] = []
        for r in rows:
            try:
                spec = self._spec(r.id, r.spec_json, utc(r.created_at))
            except SpecError as exc:
                bad.append((r.id, f"stored spec no longer valid: {exc}"))
                continue
            heads.append(QueuedJob(r.id, r.namespace, r.name, r.priority, utc(r.created_at), spec, r.retries,
                                   r.held_reason, r.request_id))
        return queues.order_jobs(heads, config, usage, now), bad

    # 2 ---------------------------------------------------------------------------------------------
    def _snapshot(self, now: datetime) -> Snapshot:
        pool = self.state.providers.get("onprem")
        free: dict[str, dict[str, float]] = {}
        if pool is not None and hasattr(pool, "free"):
            free = {k: dict(v) for k, v in pool.free().items()}
        usage: dict[str, dict[str, float]] = {}
        with self.store.read() as session:
            for ns, vcpus, mem, gpus, n in session.execute(
                sa.select(_jobs.c.namespace, sa.func.sum(_jobs.c.vcpus), sa.func.sum(_jobs.c.memory_gib),
                          sa.func.sum(_jobs.c.gpus), sa.func.count())
                .where(_jobs.c.state.in_(ACTIVE_STATES))
                .group_by(_jobs.c.namespace)
            ):
                usage[ns] = {"vcpus": float(vcpus or 0), "memory_gib": float(mem or 0),
                             "gpus": float(gpus or 0), "jobs": float(n)}
        return Snapshot(now=now, onprem_free=free, extra_offers=self.state.extra_offers(), usage=usage)

    # 3 ---------------------------------------------------------------------------------------------
    def estimate_usd(self, job: QueuedJob) -> float:
        """The priced estimate of ``job`` for budgets: the ``total_usd`` of its cheapest feasible placement
        on the enabled providers (0 when nothing is feasible, or when that placement's provider only
        simulates runs: a dry-run job is not billed, so it consumes no budget). Placements are cached per
        request for the cycle, so step 4 reuses this one."""
        try:
            extra, edge_sig = self._cycle_extra, ()
            # --- edge: the same device offers as step 4 (namespace, online), so the cache entry is shared ---
            if self.edge is not None:
                extra, edge_sig, _ = self.edge.fleet.offers_for(job.id, job.namespace, job.request, extra,
                                                                self._cycle_now)
            # --- end edge ---
            result = self._result(job, self._cycle_now, extra, edge_sig)
        except Exception:  # noqa: BLE001 - placement errors surface in step 4 with the job's failure
            return 0.0
        enabled = self.state.providers
        options = [o for o in ([result.placement] if result.placement else []) + list(result.alternatives)
                   if o.provider in enabled]
        if not options:
            return 0.0
        cheapest = min(options, key=lambda o: o.total_usd)
        from providers.base import Capability

        if Capability.DRY_RUN in getattr(enabled[cheapest.provider], "capabilities", frozenset()):
            return 0.0  # it will only be simulated: nothing is billed, so nothing is charged to a budget
        return cheapest.total_usd

    def alert(self, job_id: str, text: str) -> None:
        """Admission alert (a soft budget crossed): written as a note event on the job in step 4's
        transaction, and logged."""
        log.warning("job %s: %s", job_id, text)
        self._alerts.append((job_id, text))

    def _admit(
        self, heads: list[QueuedJob], snapshot: Snapshot
    ) -> tuple[list[QueuedJob], dict[str, str], list[tuple[str, str]]]:
        """(admitted in queue order, held job -> reason, [(job, terminal reason)] to fail at once)."""
        from policies.deadline import is_terminal

        self._cycle_now, self._cycle_extra = snapshot.now, snapshot.extra_offers
        admitted: list[QueuedJob] = []
        holds: dict[str, str] = {}
        terminal: list[tuple[str, str]] = []
        for job in heads:
            reason = None
            for check in self.admission_checks:
                reason = check(job, snapshot)
                if reason:
                    break
            if reason and is_terminal(reason):
                terminal.append((job.id, reason))
            elif reason:
                holds[job.id] = reason
            else:
                admitted.append(job)
        return admitted, holds, terminal

    # 4 ---------------------------------------------------------------------------------------------
    def _result(self, job: QueuedJob, now: datetime, extra: list[Offer], edge_sig: Any, *,
                deadline: bool = True) -> PlacementResult:
        """Placement of ``job`` over the catalog + ``extra``, cached for the cycle. Jobs asking the same
        thing get the same placement (placement is pure): the key is the request without its name.
        ``deadline=False`` places without the deadline (to price what meeting it costs).

        A request without a deadline places the same at any time (the deadline is the only input of
        placement that reads ``now``; one met at every location places as none, see
        :func:`policies.placement.deadline.equivalent_request`), so its result is also kept across cycles
        (:meth:`_kept`) while the catalog, the egress model, the interruption model and the extra offers
        stay the same. Savings
        baselines are left out here; :meth:`_baselines` adds them to the placements that are recorded."""
        request = job.request
        seen = self._keys.get((job.id, deadline, now, edge_sig))  # a job is placed up to 3 times a cycle
        if seen is not None and seen[0] is request:
            cache_key = seen[1]
        else:
            enabled = self._enabled
            allowed = tuple(p for p in (request.providers or tuple(enabled)) if p in enabled)
            key = dataclasses.replace(request, name="", providers=tuple(sorted(allowed)))
            if not deadline:
                key = dataclasses.replace(key, deadline=None)
            else:  # a deadline met everywhere places as no deadline: one (kept) placement for all such jobs
                key = equivalent_request(key, now)
            cache_key = (key, job.namespace, edge_sig)
            self._keys[(job.id, deadline, now, edge_sig)] = (request, cache_key)
        key = cache_key[0]
        result = self._placements.get(cache_key)
        t0 = time.perf_counter()
        if result is None:
            kept = self._kept(cache_key, extra)
            if kept is not None:
                result = kept[1]
            else:
                result = self.state.place(dataclasses.replace(key, name=request.name), now=now,
                                          extra_offers=extra, top=8, baselines=False)
                if key.deadline is None:
                    self._keep(cache_key, extra, result)
            self._placements[cache_key] = result
        elif result.job != request.name:
            result = dataclasses.replace(result, job=request.name)
        if deadline:  # what step 4 needs to add the baselines if this job's placement is recorded
            self._inputs[job.id] = (cache_key, now, extra)
        self.metrics.placement_latency.observe(time.perf_counter() - t0)
        return result

    def _kept(self, cache_key: Any, extra: list[Offer]) -> list[Any] | None:
        """The entry ``[extra, result, baselines or None]`` kept across cycles for ``cache_key``, when its
        extra offers equal ``extra`` (else ``None``)."""
        hit = self._kept_placements.get(cache_key)
        if hit is None or hit[0] != extra:
            return None
        self._kept_placements.move_to_end(cache_key)
        return hit

    def _keep(self, cache_key: Any, extra: list[Offer], result: PlacementResult) -> None:
        self._kept_placements[cache_key] = [list(extra), result, None]
        self._kept_placements.move_to_end(cache_key)
        while len(self._kept_placements) > KEPT_PLACEMENTS:
            self._kept_placements.popitem(last=False)

    def _check_placement_inputs(self) -> None:
        """Forget the placements kept across cycles when an input of placement other than the request
        changed (a refreshed catalog, new edge sites in the egress model, a new interruption model)."""
        from pricing.interruption import load_interruptions

        inputs = (self.state.catalog, self.state.egress_model(), load_interruptions())
        if len(inputs) != len(self._placement_inputs) or any(
                a is not b for a, b in zip(inputs, self._placement_inputs, strict=True)):
            self._kept_placements.clear()
            self._placement_inputs = inputs
        self._enabled = set(self.state.providers)

    def _binding(self, job_id: str, option: PlacementOption) -> dict[str, str] | None:
        """The warm-pool binding of ``job_id`` when ``option`` is its warm option (else ``None``)."""
        return self.warm.binding(job_id, option) if self.warm is not None else None

    def _baselines(self, job: QueuedJob, result: PlacementResult) -> Any:
        """The savings baselines of ``job``'s placement ``result`` (as ``place(..., baselines=True)``
        computes them), once per distinct request: memoised for the cycle, and across cycles with the kept
        placement of a request without a deadline."""
        inputs = self._inputs.get(job.id)
        if inputs is None or result.placement is None:
            return {}
        cache_key, now, extra = inputs
        got = self._cycle_baselines.get(cache_key)
        if got is None:
            kept = self._kept(cache_key, extra)
            if kept is not None and kept[2] is not None:
                got = kept[2]
            else:
                got = self.state.baselines(dataclasses.replace(cache_key[0], name=job.request.name), result,
                                           now=now, extra_offers=extra)
                if kept is not None and kept[1].placement == result.placement:
                    kept[2] = got
            self._cycle_baselines[cache_key] = got
        return got

    def _ranked(self, result: PlacementResult) -> list[PlacementOption]:
        enabled = set(self.state.providers)
        ranked: list[PlacementOption] = []
        seen: set[tuple[str, str, str, str]] = set()
        for opt in ([result.placement] if result.placement else []) + list(result.alternatives):
            option_key = (opt.provider, opt.region, opt.instance_type, opt.capacity)
            if opt.provider in enabled and option_key not in seen:
                seen.add(option_key)
                ranked.append(opt)
        return ranked

    def _deadline_note(self, job: QueuedJob, chosen: PlacementOption, snapshot: Snapshot, extra: list[Offer],
                       edge_sig: Any) -> str:
        """"meets the deadline for $X more than the cheapest: ..." when ``chosen`` meets the deadline and
        the cheapest option overall (placed without the deadline) would not; else ""."""
        from policies.deadline import choose_for_deadline

        request = job.request
        cheapest = min(self._ranked(self._result(job, snapshot.now, extra, edge_sig, deadline=False)),
                       key=lambda o: o.total_usd, default=None)
        if cheapest is None or cheapest.total_usd >= chosen.total_usd - 1e-9:
            return ""
        decision = choose_for_deadline([chosen, cheapest], deadline=utc(request.deadline) if request.deadline
                                       else None, now=snapshot.now, duration_hours=request.duration_hours)
        if decision.option is chosen and decision.premium_usd > 1e-9:
            return decision.explanation
        return ""

    def _choose(self, job: QueuedJob, snapshot: Snapshot
                ) -> tuple[PlacementResult, list[PlacementOption] | None, str]:
        """The placement result and the ordered options to provision (None = hold), plus a note.

        An empty list fails the job; the note then starts with ``DeadlineInfeasible`` when options exist
        but none meets the deadline. With a deadline, the returned result's ``explanation`` ends with the
        premium paid to meet it (see :meth:`_deadline_note`)."""
        request = job.request
        # --- edge: this job's devices (namespace, offline vs its wait, not one that just lost it) ---
        extra, edge_sig, edge_waiting = snapshot.extra_offers, (), ()
        if self.edge is not None:
            extra, edge_sig, edge_waiting = self.edge.fleet.offers_for(
                job.id, job.namespace, request, snapshot.extra_offers, snapshot.now)
        # --- end edge ---
        result = self._result(job, snapshot.now, extra, edge_sig)
        ranked = self._ranked(result)
        # --- warm pools: a job of a pool's namespace/queue runs on a warm instance with room ---
        warm = self.warm.choose(job, snapshot.now) if self.warm is not None else None
        if warm is not None:
            option, note = warm
            fallback = [o for o in ranked if o.provider != "onprem" and o.site != "onprem"]
            return dataclasses.replace(result, explanation=f"{note}. {result.explanation}".strip()), \
                [option, *fallback], note
        # --- end warm pools ---
        if not ranked:
            if edge_waiting:  # edge: its device went silent with the task; wait for it within the job's wait
                return result, None, f"waiting for edge device {', '.join(edge_waiting)} to come back"
            if self.edge is not None and (unmatched := self.edge.fleet.unmatched_selector(job.namespace, request)):
                return result, None, unmatched  # edge: a nodeSelector no device satisfies now: stay pending
            if request.deadline is not None:
                from policies.deadline import choose_for_deadline

                anyway = self._ranked(self._result(job, snapshot.now, extra, edge_sig, deadline=False))
                if anyway:
                    decision = choose_for_deadline(anyway, deadline=utc(request.deadline), now=snapshot.now,
                                                   duration_hours=request.duration_hours)
                    if not decision.feasible:
                        return result, [], decision.explanation
            return result, [], ""
        nodes = max(1, request.nodes)
        hours_left = (
            (utc(request.deadline) - snapshot.now).total_seconds() / 3600.0 if request.deadline else None
        )
        onprem = [o for o in ranked if o.provider == "onprem"]
        cloud = [o for o in ranked if o.provider != "onprem"]
        options: list[PlacementOption] | None = None
        why = WAIT_ONPREM
        self._gang_plans.pop(job.id, None)
        self._notes.pop(job.id, None)
        in_time = [o for o in onprem if hours_left is None
                   or (o.finish_hours or (o.transfer_hours + request.duration_hours)) <= hours_left]
        fitting = [o for o in in_time if snapshot.fits(o.instance_type, request.vcpus * nodes,
                                                       request.memory_gib * nodes, request.gpus * nodes)]
        if nodes > 1 and self.gang_policy == SPREAD:
            fitting = []  # a spread gang goes over sites (zones) below, not onto one host
        # --- load balancing: the plugin picks among equivalent on-prem hosts / cloud pools ---
        fitting, lb_onprem = self._balance(job, fitting, snapshot)
        for opt in fitting[:1]:
            snapshot.reserve(opt.instance_type, request.vcpus * nodes, request.memory_gib * nodes,
                             request.gpus * nodes)
            options, why = [opt] + cloud, "on-prem has room" + (f"; {lb_onprem}" if lb_onprem else "")
        # --- gang: N nodes over several on-prem hosts (one site with sameZone), all or nothing ---
        if options is None and nodes > 1 and in_time:
            gang, gang_why = self._gang_onprem(job, in_time, snapshot)
            if gang is not None:
                options, why = [gang] + cloud, f"on-prem has room: {gang_why}"
        gang_note = ""
        if options is None and cloud:
            cloud, lb_cloud = self._balance(job, cloud, snapshot)
            cloud, gang_note = self._gang_cloud(job, cloud)  # gang: one zone (sameZone) or spread
            if cloud:
                options = cloud
                why = "on-prem full: burst to cloud" if onprem else "cheapest cloud placement"
                if cloud[0].site == "onprem":  # a Slurm/Ray pool: on-prem too, and its engine queues the job
                    why = f"on-prem pool {cloud[0].provider}:{cloud[0].instance_type}"
                why += "".join(f"; {n}" for n in (lb_cloud, gang_note) if n)
        if options is None and gang_note and not onprem:
            return result, [], gang_note
        # --- end gang / load balancing ---
        if options is None:
            return result, None, why
        if request.deadline is not None:
            note = self._deadline_note(job, options[0], snapshot, extra, edge_sig)
            if note:
                why = f"{why}; {note}"
                result = dataclasses.replace(result, explanation=f"{result.explanation} {note}".strip())
        return result, options, why

    # 4a: gang jobs and load balancing -------------------------------------------------------------------
    def _balance(self, job: QueuedJob, candidates: list[PlacementOption], snapshot: Snapshot
                 ) -> tuple[list[PlacementOption], str]:
        """``candidates`` with the load-balancing choice first, and a note for the PLACED event ("" when
        nothing was balanced). The group is the candidates whose ``total_usd`` is within
        :attr:`load_balancing_tolerance` of the first's, one per pool (:func:`_pool_name`); with two or more
        pools, :func:`policies.loadbalance.choose_pool` scores them with :attr:`load_balancing` weights over
        the active jobs per pool and the measured runtimes per pool (both from the store). Equal scores keep
        the placement's rank order."""
        weights = self.load_balancing
        if not weights or len(candidates) < 2:
            return candidates, ""
        first = candidates[0]
        slack = abs(first.total_usd) * self.load_balancing_tolerance + 1e-9
        by_pool: dict[str, PlacementOption] = {}
        for o in candidates:
            if abs(o.total_usd - first.total_usd) <= slack:
                by_pool.setdefault(_pool_name(o), o)
        if len(by_pool) < 2:
            return candidates, ""
        running = self._lb_load()
        uses_history = any(w and n in ("performance", "predictive") for n, w in weights.items())
        runtimes = self._lb_history(list(by_pool)) if uses_history else {}
        busiest = max(running.get(n, 0) for n in by_pool)
        pools = []
        for name, o in by_pool.items():
            run = running.get(name, 0)
            if o.provider == "onprem":  # a host: what runs there plus how many more of this job fit
                slots = run + _nodes_that_fit(snapshot.onprem_free.get(o.instance_type), job.request)
            else:  # a cloud region has no fixed size: equal slots, so fewer active jobs score higher
                slots = busiest + 1
            pools.append(LBPool(name, slots=max(1, slots), running=run))
        group = tuple(sorted(by_pool))
        choice = choose_pool(LBContext(pools, runtimes_hours=runtimes, last=self._rr_last.get(group)), weights)
        best = max(choice.scores.values())
        chosen = next(n for n in by_pool if choice.scores.get(n, float("-inf")) >= best - 1e-9)
        label = ", ".join(n if w == 1 else f"{n}:{w:g}" for n, w in sorted(weights.items()) if w)
        scores = ", ".join(f"{n} {choice.scores.get(n, 0.0):g} ({running.get(n, 0)} active)" for n in by_pool)
        note = (f"load balancing ({label}) among {len(by_pool)} options within "
                f"{self.load_balancing_tolerance:.1%} of ${first.total_usd:.4f}: chose {chosen}; scores {scores}")
        self._notes.setdefault(job.id, {})["load_balancing"] = {
            "plugins": dict(weights), "chosen": chosen, "group": list(group),
            "scores": {n: choice.scores.get(n, 0.0) for n in by_pool},
            "active": {n: running.get(n, 0) for n in by_pool}, "tolerance": self.load_balancing_tolerance,
        }
        pick = by_pool[chosen]
        return [pick] + [o for o in candidates if o is not pick], note

    def _lb_took(self, job_id: str, option: PlacementOption) -> None:
        """A job was placed on ``option`` this cycle: count it as active and move the round-robin cursor."""
        if self._lb_running is not None:
            name = _pool_name(option)
            self._lb_running[name] = self._lb_running.get(name, 0) + 1
        lb = self._notes.get(job_id, {}).get("load_balancing")
        if lb is not None and lb["chosen"] == _pool_name(option):
            self._rr_last[tuple(lb["group"])] = lb["chosen"]

    def _lb_load(self) -> dict[str, int]:
        """Active (placed, provisioning, running) jobs per pool, read from the store once per cycle."""
        if self._lb_running is None:
            counts: dict[str, int] = {}
            with self.store.read() as session:
                for prov, region, n in session.execute(
                    sa.select(_jobs.c.provider, _jobs.c.region, sa.func.count())
                    .where(_jobs.c.state.in_(ACTIVE_STATES), _jobs.c.provider != "onprem")
                    .group_by(_jobs.c.provider, _jobs.c.region)
                ):
                    counts[f"{prov}:{region}"] = int(n)
                for (text,) in session.execute(
                    sa.select(_jobs.c.placement_json)
                    .where(_jobs.c.state.in_(ACTIVE_STATES), _jobs.c.provider == "onprem")
                ):
                    host = self._placed_host(text)
                    if host:
                        counts[f"onprem:{host}"] = counts.get(f"onprem:{host}", 0) + 1
            self._lb_running = counts
        return self._lb_running

    @staticmethod
    def _placed_host(placement_json: str | None) -> str | None:
        try:
            return str(json.loads(placement_json or "{}").get("instance_type") or "") or None
        except (ValueError, AttributeError):
            return None

    def _lb_history(self, pools: list[str]) -> dict[str, list[float]]:
        """Measured runtimes (hours, oldest first) of the last :data:`LB_HISTORY_RUNS` SUCCEEDED jobs per
        pool, from the store (``finished_at - started_at``), cached for the cycle."""
        missing = [p for p in pools if p not in self._lb_runtimes]
        if missing:
            with self.store.read() as session:
                for pool in missing:
                    provider, _, where = pool.partition(":")
                    stmt = (sa.select(_jobs.c.started_at, _jobs.c.finished_at, _jobs.c.placement_json)
                            .where(_jobs.c.state == JobState.SUCCEEDED.value, _jobs.c.provider == provider,
                                   _jobs.c.started_at.is_not(None), _jobs.c.finished_at.is_not(None))
                            .order_by(_jobs.c.finished_at.desc()))
                    if provider == "onprem":
                        rows = [r for r in session.execute(stmt.limit(LB_HISTORY_RUNS * 20))
                                if self._placed_host(r.placement_json) == where][:LB_HISTORY_RUNS]
                    else:
                        rows = list(session.execute(stmt.where(_jobs.c.region == where).limit(LB_HISTORY_RUNS)))
                    self._lb_runtimes[pool] = [
                        max(0.0, (utc(r.finished_at) - utc(r.started_at)).total_seconds() / 3600.0)
                        for r in reversed(rows)
                    ]
        return {p: self._lb_runtimes[p] for p in pools if self._lb_runtimes.get(p)}

    def _gang_onprem(self, job: QueuedJob, in_time: list[PlacementOption], snapshot: Snapshot
                     ) -> tuple[PlacementOption | None, str]:
        """All N nodes of a gang over the on-prem hosts' free capacity (:func:`policies.gang.place_gang`,
        one site when ``sameZone``; ``pack`` or ``spread`` over sites by :attr:`gang_policy`), or
        ``(None, reason)``. Hosts count only at sites placement found feasible (``in_time``: their cost,
        transfer and deadline are known). Books the capacity in ``snapshot`` and keeps the plan for step 5;
        returns the option stored as the job's placement (the first host, priced at the gang's mean)."""
        pool = self.state.providers.get("onprem")
        if pool is None:
            return None, ""
        request = job.request
        nodes = max(1, request.nodes)
        templates: dict[str, PlacementOption] = {}
        for o in in_time:
            templates.setdefault(o.region, o)
        slots: list[Slot] = []
        for offer in pool.offers():
            it, site = offer.instance_type, offer.location.region
            if site not in templates or it.gpus < request.gpus or it.arch != request.arch:
                continue
            if request.accelerator and (it.accelerator or "").lower() != request.accelerator.lower():
                continue
            n = min(nodes, _nodes_that_fit(snapshot.onprem_free.get(it.name), request))
            if n > 0:
                slots.append(Slot("onprem", site, it.name, offer.hourly_usd, n, None, it.interconnect, it.gpus))
        got = place_gang(nodes, slots, same_zone=request.same_zone, interconnect=request.interconnect,
                         policy=self.gang_policy)
        if not isinstance(got, GangPlacement):
            return None, got
        plan: list[tuple[PlacementOption, int]] = []
        hours = request.duration_hours
        for slot, n in got.assignments:
            t = templates[slot.region]
            plan.append((dataclasses.replace(
                t, instance_type=slot.instance_type, hourly_usd=slot.hourly_usd,
                compute_usd=slot.hourly_usd * n * (hours + t.transfer_hours),
                total_usd=slot.hourly_usd * n * (hours + t.transfer_hours) + t.egress_usd), n))
            snapshot.reserve(slot.instance_type, request.vcpus * n, request.memory_gib * n, request.gpus * n)
        first = plan[0][0]
        compute = got.hourly_usd * (hours + first.transfer_hours)
        summary = dataclasses.replace(first, hourly_usd=got.hourly_usd / nodes, compute_usd=compute,
                                      total_usd=compute + first.egress_usd)
        if len(plan) > 1:
            self._gang_plans[job.id] = plan
        parts = ", ".join(f"{o.instance_type} x{n}" for o, n in plan)
        self._notes.setdefault(job.id, {})["gang"] = [
            {"provider": o.provider, "region": o.region, "zone": o.zone, "instance_type": o.instance_type,
             "nodes": n} for o, n in plan]
        return summary, f"gang of {nodes} on {parts} ({got.explanation})"

    def _zone_offers(self, provider: str) -> list[Offer]:
        """The zone-level offers of ``provider`` (its ``offers()``, cached :data:`ZONE_CACHE_SECONDS`)."""
        hit = self._zones.get(provider)
        if hit is not None and time.monotonic() - hit[0] < ZONE_CACHE_SECONDS:
            return hit[1]
        try:
            offers = [o for o in self.state.get_provider(provider).offers() if o.location.zone]
        except Exception as exc:  # noqa: BLE001 - no zones known is a placement answer, not a crash
            log.warning("listing the offers of %s for zones failed: %s", provider, exc)
            offers = []
        self._zones[provider] = (time.monotonic(), offers)
        return offers

    def _zone_slots(self, option: PlacementOption, nodes: int) -> list[Slot]:
        """One slot of ``nodes`` per zone the provider offers ``option``'s type in its region (else any zone
        it lists in that region), priced from those offers (else the option's price)."""
        offers = [o for o in self._zone_offers(option.provider) if o.region == option.region]
        same = [o for o in offers if o.instance_type.name == option.instance_type
                and o.capacity.value == option.capacity]
        price: dict[str, float] = {}
        for o in same or offers:
            z = o.location.zone or ""
            price[z] = min(price.get(z, float("inf")), o.hourly_usd if same else option.hourly_usd)
        return [Slot(option.provider, option.region, option.instance_type, p, nodes, z)
                for z, p in sorted(price.items())]

    def _gang_cloud(self, job: QueuedJob, cloud: list[PlacementOption]) -> tuple[list[PlacementOption], str]:
        """Cloud options for a gang (unchanged for one node): with ``sameZone`` each keeps or gets a zone
        (from a zone-level offer, or the cheapest zone the provider lists; options with no known zone are
        dropped, and none left returns ``([], "GangUnschedulable: ...")``); with ``spread`` the first option
        is split over the zones of its region, one launch per zone (kept for step 5)."""
        request = job.request
        nodes = max(1, request.nodes)
        if nodes <= 1 or not cloud:
            return cloud, ""
        if request.same_zone:
            out: list[PlacementOption] = []
            unknown: list[str] = []
            for o in cloud:
                if o.zone:
                    out.append(o)
                    continue
                got = place_gang(nodes, self._zone_slots(o, nodes), same_zone=True)
                if isinstance(got, GangPlacement):
                    out.append(dataclasses.replace(o, zone=got.assignments[0][0].zone))
                elif f"{o.provider}:{o.region}" not in unknown:
                    unknown.append(f"{o.provider}:{o.region}")
            if not out:
                return [], (f"GangUnschedulable: needs {nodes} nodes in one zone, but no zone is known for "
                            f"{', '.join(unknown[:5])}. To fix: load a catalog with zones (BROKER_CATALOG_DIR), "
                            "use a provider that lists its zones, or drop placement.sameZone")
            self._notes.setdefault(job.id, {})["gang"] = [
                {"provider": out[0].provider, "region": out[0].region, "zone": out[0].zone,
                 "instance_type": out[0].instance_type, "nodes": nodes}]
            return out, f"gang of {nodes} in one zone ({out[0].provider}:{out[0].zone})"
        if self.gang_policy != SPREAD:
            return cloud, ""
        first = cloud[0]
        got = place_gang(nodes, self._zone_slots(first, nodes), policy=SPREAD)
        if not isinstance(got, GangPlacement) or len(got.zones) < 2:
            return cloud, f"gang of {nodes} in one launch (fewer than two zones known to spread over)"
        plan = [(dataclasses.replace(first, zone=slot.zone), n) for slot, n in got.assignments]
        self._gang_plans[job.id] = plan
        self._notes.setdefault(job.id, {})["gang"] = [
            {"provider": o.provider, "region": o.region, "zone": o.zone, "instance_type": o.instance_type,
             "nodes": n} for o, n in plan]
        return cloud, f"gang of {nodes} spread over {', '.join(f'{o.zone} x{n}' for o, n in plan)}"

    def _launch_gang(self, job: QueuedJob, request_id: str, plan: list[tuple[PlacementOption, int]],
                     stored: PlacementOption) -> Any:
        """Launch a gang's parts (one launch per host or zone, request ids ``<request>.g<k>``, every instance
        tagged ``hb-request=<request>``). A part that fails or returns fewer nodes than asked terminates
        everything launched for the request and returns the error (retryable: the job backs off)."""
        from broker.errors import CapacityError
        from providers.base import offer_from_option
        from providers.errors import map_exception
        from providers.failover import ProvisionOutcome

        tags = {TAG_JOB: job.id, TAG_NAMESPACE: job.namespace, TAG_REQUEST: request_id}
        got: list[Instance] = []
        attempts: list[Attempt] = []
        for k, (opt, n) in enumerate(plan):
            def attempt(outcome: str, message: str, retryable: bool = False, o: PlacementOption = opt) -> Attempt:
                return Attempt(provider=o.provider, region=o.region, instance_type=o.instance_type,
                               capacity=o.capacity, outcome=outcome, message=message, at=self.clock.now(),
                               retryable=retryable)
            err: ProviderError | None = None
            try:
                part = self.state.get_provider(opt.provider).launch(
                    offer_from_option(opt), n, f"{request_id}.g{k}", tags=tags, job=job.spec)
                got.extend(part)
                if len(part) < n:
                    err = CapacityError(f"GangUnschedulable: {opt.provider}:{opt.region} gave {len(part)} of {n} "
                                        f"nodes of part {k + 1}/{len(plan)}. To fix: wait; the job retries",
                                        provider=opt.provider, region=opt.region, request_id=request_id)
            except Exception as raw:  # noqa: BLE001 - adapters should map, but never trust it
                err = map_exception(raw, opt.provider, opt.region, request_id) or ProviderError(
                    f"{opt.provider}:{opt.region}: unexpected {type(raw).__name__}: {raw}",
                    provider=opt.provider, region=opt.region, request_id=request_id)
            if err is not None:
                attempts.append(attempt(err.kind, f"gang part {k + 1}/{len(plan)}: {err}", err.retryable))
                self._abandon_gang(plan, request_id, got)
                return ProvisionOutcome(instances=[], option=None, attempts=attempts, error=err)
            attempts.append(attempt("launched", f"gang part {k + 1}/{len(plan)}: {len(part)} instance(s): "
                                    + ", ".join(i.id for i in part)))
        return ProvisionOutcome(instances=got, option=stored, attempts=attempts, error=None)

    def _abandon_gang(self, plan: list[tuple[PlacementOption, int]], request_id: str, got: list[Instance]) -> None:
        """Terminate what a gang launched: the instances returned, and any tagged with its request id."""
        from providers.base import TAG_REQUEST as REQUEST_TAG

        for provider in dict.fromkeys(o.provider for o, _ in plan):
            ids = {i.id for i in got if i.provider == provider}
            try:
                ids |= {i.id for i in self.state.get_provider(provider).instances({REQUEST_TAG: request_id})
                        if i.state not in (InstanceState.TERMINATED, InstanceState.SUCCEEDED, InstanceState.FAILED)}
            except Exception as exc:  # noqa: BLE001 - reconciliation catches leftovers by tag
                log.warning("listing %s for a gang's leftovers failed: %s", provider, exc)
            if ids:
                self.state.terminate_instances(provider, sorted(ids), f"{request_id}:partial-gang")

    def _whole_gang(self, job: QueuedJob, request_id: str, outcome: Any) -> Any:
        """``outcome`` unless it launched fewer than the job's N nodes: then those are terminated and the
        outcome is a retryable ``GangUnschedulable`` capacity error (never a partial gang running)."""
        nodes = max(1, job.request.nodes)
        if not outcome.ok or len(outcome.instances) >= nodes:
            return outcome
        from broker.errors import CapacityError
        from providers.failover import ProvisionOutcome

        opt = outcome.option
        self._abandon_gang([(opt, nodes)], request_id, outcome.instances)
        err = CapacityError(f"GangUnschedulable: {opt.provider}:{opt.region} launched {len(outcome.instances)} of "
                            f"{nodes} nodes; terminated them. To fix: wait; the job retries",
                            provider=opt.provider, region=opt.region, request_id=request_id)
        short = Attempt(provider=opt.provider, region=opt.region, instance_type=opt.instance_type,
                        capacity=opt.capacity, outcome=err.kind, message=str(err), at=self.clock.now(),
                        retryable=True)
        return ProvisionOutcome(instances=[], option=None, attempts=[*outcome.attempts, short], error=err)

    # 4b: preemption ---------------------------------------------------------------------------------
    def _preempt(self, job: QueuedJob, result: PlacementResult, snapshot: Snapshot, now: datetime,
                 taken: set[str]) -> list[dict[str, Any]]:
        """Stop lower-priority on-prem runs so ``job`` (on-prem only, no room) fits, when
        :func:`policies.preemption.find_victims` finds a plan on a host ``job`` may use. Each victim gets
        SIGTERM and :attr:`preemption_grace_seconds` to write its checkpoint, then SIGKILL. Frees their
        capacity in ``snapshot`` and returns one dict per stopped victim (for step 4's transaction);
        victims already stopped this cycle (``taken``) are not candidates."""
        pool = self.state.providers.get("onprem")
        if pool is None or not hasattr(pool, "stop"):
            return []
        hosts = {o.instance_type for o in self._ranked(result) if o.provider == "onprem"}
        free = {h: Resources(f["vcpus"], f["memory_gib"], f["gpus"])
                for h, f in snapshot.onprem_free.items() if h in hosts}
        if not free:
            return []
        from broker.policy_store import list_priority_classes, workload_from_row
        from policies.admission import with_resolved_priority
        from policies.preemption import find_victims

        with self.store.read() as session:
            rows = list(session.execute(
                sa.select(_jobs.c.id, _jobs.c.namespace, _jobs.c.name, _jobs.c.priority, _jobs.c.created_at,
                          _jobs.c.spec_json, _jobs.c.placement_json, _jobs.c.started_at, _jobs.c.instances_json,
                          _jobs.c.vcpus, _jobs.c.memory_gib, _jobs.c.gpus, _jobs.c.request_id, _jobs.c.retries)
                .where(_jobs.c.state == JobState.RUNNING.value, _jobs.c.provider == "onprem",
                       _jobs.c.priority < job.priority)
            ))
            if not rows:
                return []
            classes = list_priority_classes(session)
        running: list[Workload] = []
        by_id: dict[str, Any] = {}
        for r in rows:
            if r.id in taken:
                continue
            try:
                w = workload_from_row(r)
            except SpecError:
                continue
            spec = self._spec(r.id, r.spec_json, utc(r.created_at))
            running.append(w.with_(last_checkpoint_at=_last_checkpoint(spec)))
            by_id[r.id] = r
        preemptor = with_resolved_priority(
            Workload.from_spec(job.id, job.spec, created_at=job.created_at, priority=job.priority)
            .with_(namespace=job.namespace), classes)
        plan = find_victims(preemptor, running, free, now=now)
        if not plan.possible or not plan.targets:
            return []
        stopped: list[dict[str, Any]] = []
        for target in plan.targets:
            row = by_id[target.workload_id]
            ids = _instance_ids(row.instances_json)
            finished_anyway = False
            for iid in ids:
                try:
                    inst = pool.stop(iid, self.preemption_grace_seconds)
                except Exception as exc:  # noqa: BLE001 - a run we cannot stop is not a victim
                    log.warning("preemption: stopping %s of %s failed: %s", iid, row.id, exc)
                    continue
                finished_anyway |= inst.state is InstanceState.SUCCEEDED
            if finished_anyway:  # it completed before the signal: step 6 records its success
                continue
            self.state.terminate_instances("onprem", ids, f"{row.id}:preempted")
            host = target.host or plan.host
            if host is not None and host in snapshot.onprem_free:
                f = snapshot.onprem_free[host]
                f["vcpus"] += float(row.vcpus)
                f["memory_gib"] += float(row.memory_gib)
                f["gpus"] += float(row.gpus)
            taken.add(row.id)
            # a victim's event never names another namespace's job (issue 17)
            by = f"{job.id} ({job.name}, " if row.namespace == job.namespace else "a job of another namespace ("
            reason = (
                f"{PREEMPTED_BY} {by}priority {job.priority} > {target.priority}) on {host}: "
                f"stopped with SIGTERM and a grace period to write its checkpoint; "
                f"{target.work_lost_seconds:.0f} s of work since its last checkpoint at risk; requeued"
            )
            stopped.append({"row": row, "reason": reason, "target": target,
                            "by": job.id if row.namespace == job.namespace else None})
            log.info("job %s preempted by %s on %s", row.id, job.id, host)
        return stopped

    def _place(
        self,
        admitted: list[QueuedJob],
        holds: dict[str, str],
        snapshot: Snapshot,
        failed_parse: list[tuple[str, str]],
        now: datetime,
        heads: list[QueuedJob],
    ) -> tuple[list[tuple[QueuedJob, list[PlacementOption]]], int]:
        decided: list[tuple[QueuedJob, PlacementResult, list[PlacementOption], str]] = []
        fails: list[tuple[str, str]] = list(failed_parse)
        preempted: list[dict[str, Any]] = []
        taken: set[str] = set()
        for job in admitted:
            try:
                result, options, why = self._choose(job, snapshot)
                if options is None and why == WAIT_ONPREM:
                    stopped = self._preempt(job, result, snapshot, now, taken)
                    if stopped:
                        preempted.extend(stopped)
                        result, options, why = self._choose(job, snapshot)
                        if options:
                            why = f"{why} after preempting {_victims(job, stopped)}"
            except Exception as exc:  # noqa: BLE001 - one bad job must not stop the queue
                log.exception("placement of %s failed", job.id)
                fails.append((job.id, f"placement failed: {exc}"))
                continue
            if options is None:
                holds[job.id] = why
            elif not options:
                if why:
                    fails.append((job.id, why))
                    continue
                detail = result.explanation or ", ".join(f"{k}: {v}" for k, v in result.rejected.items())
                fails.append((job.id, f"no feasible placement on the enabled providers ({detail or 'no offers'})"))
            else:
                decided.append((job, result, options, why))
                self._lb_took(job.id, options[0])  # load balancing: counts for the next jobs of this cycle
                if self.edge is not None and options[0].provider == "edge":  # edge: its slots are taken
                    self.edge.fleet.reserve(options[0].region, job.request.vcpus, job.request.memory_gib)
        by_id = {j.id: j for j in heads}
        placed: list[tuple[QueuedJob, list[PlacementOption]]] = []
        try:
            from broker import decisions
        except ImportError:  # pragma: no cover - the reports area is optional
            decisions = None  # type: ignore[assignment]
        with self._tx() as session:
            ids = [j.id for j, *_ in decided] + [i for i, _ in fails] + list(holds)
            live = self._lock_rows(session, ids, JobState.PENDING)
            transitions: list[Transition] = []
            records: list[dict[str, Any]] = []
            if preempted:
                transitions.extend(self._preempted_transitions(session, preempted, now))
            for job, result, options, why in decided:
                if job.id not in live:
                    continue
                chosen = options[0]
                request_id = _next_request_id(job)
                transitions.append(Transition(
                    job.id, JobState.PENDING, JobState.PLACED, reason=why,
                    data={"provider": chosen.provider, "region": chosen.region,
                          "instance_type": chosen.instance_type, "total_usd": chosen.total_usd,
                          **self._notes.get(job.id, {})},  # gang parts, load-balancing choice
                    fields={"placement_json": _option_json(chosen, self._binding(job.id, chosen)),
                            "provider": chosen.provider, "region": chosen.region, "held_reason": None},
                ))
                transitions.append(Transition(
                    job.id, JobState.PLACED, JobState.PROVISIONING, reason="provisioning",
                    fields={"request_id": request_id},
                ))
                records.append(dict(
                    job_id=job.id, namespace=job.namespace, request=job.request,
                    result=dataclasses.replace(result, placement=chosen, baselines=self._baselines(job, result)),
                    policy="cost",
                    catalog_version=self.state.catalog_version, now=now, kind="placement",
                ))
                self.metrics.queue_wait.observe(max(0.0, (now - job.created_at).total_seconds()))
                placed.append((dataclasses.replace(job, request_id=request_id), options))
            for job_id, reason in fails:
                if job_id in live:
                    transitions.append(Transition(job_id, JobState.PENDING, JobState.FAILED, reason=reason,
                                                  fields={"message": reason, "finished_at": now}))
            for job_id, text in self._alerts:  # noted before the job's transitions: it was PENDING then
                if job_id in live:
                    note(session, job_id, JobState.PENDING, text, now=now, data={"alert": True})
            apply_transitions(session, transitions, now=now)
            if records and decisions is not None:
                if self._decision_memo is None:
                    self._decision_memo = decisions.JsonMemo()
                decisions.record_decisions(session, records, memo=self._decision_memo)
            for job_id, reason in holds.items():
                held = by_id.get(job_id)
                if job_id in live and held is not None and held.held_reason != reason:
                    session.connection().execute(
                        _jobs.update().where(_jobs.c.id == job_id).values(held_reason=reason, updated_at=now)
                    )
                    note(session, job_id, JobState.PENDING, f"held: {reason}", now=now)
        self._alerts = []
        self._count(transitions)
        return placed, len([t for t in transitions if t.to_state is JobState.FAILED])

    def _preempted_transitions(self, session: Any, preempted: list[dict[str, Any]], now: datetime
                               ) -> list[Transition]:
        """RUNNING -> PENDING for each stopped victim, with its partial run charged to the budget ledger
        and to its namespace's fair-share usage (its estimate goes: it is placed and priced anew)."""
        live = self._lock_rows(session, [v["row"].id for v in preempted], JobState.RUNNING, cancelling=False)
        out: list[Transition] = []
        ended: list[tuple[Any, float]] = []
        for v in preempted:
            row = v["row"]
            if row.id not in live:
                continue
            self._preempted += 1
            out.append(Transition(
                row.id, JobState.RUNNING, JobState.PENDING, reason=v["reason"],
                data={"preempted_by": v["by"], "work_lost_seconds": v["target"].work_lost_seconds},
                fields={"instances_json": None, "placement_json": None, "not_before": None,
                        "held_reason": v["reason"], "message": v["reason"],
                        "request_id": _preempted_request_id(row.id, row.retries, row.request_id)},
            ))
            started = utc(row.started_at) if row.started_at else now
            ended.append((row, max(0.0, (now - started).total_seconds() / 3600.0)))
        self.charge_runs(session, [(r, h, 0.0) for r, h in ended], now)
        return out

    def charge_runs(self, session: Any, runs: list[tuple[Any, float, float]], now: datetime) -> None:
        """Charge ended runs ``(row, runtime hours, estimate already counted)``: a budget-ledger row of
        ``actual - estimate`` per run and the namespaces' fair-share usage (one upsert per namespace).
        ``row`` has ``id``, ``namespace``, ``placement_json``, ``spec_json``, ``created_at``, ``vcpus``,
        ``memory_gib``, ``gpus``."""
        if not runs:
            return
        from broker import queues
        from broker.policy_store import DRY_RUN_KIND, record_spends

        usage: dict[str, UsageVector] = {}
        spends: list[tuple[str, float, datetime, str, str]] = []
        for row, hours, estimate in runs:
            try:
                nodes = max(1, self._spec(row.id, row.spec_json, utc(row.created_at)).request.nodes)
            except SpecError:
                nodes = 1
            actual = _run_cost(row.placement_json, hours, nodes)
            if abs(actual - estimate) > 1e-12:  # a dry-run job's correction is simulated spend (no budget)
                spends.append((row.namespace, actual - estimate, now, row.id,
                               DRY_RUN_KIND if getattr(row, "dry_run", False) else "actual"))
            add = queues.job_usage(float(row.vcpus), float(row.memory_gib), float(row.gpus), hours, actual)
            usage[row.namespace] = usage.get(row.namespace, UsageVector()) + add
        record_spends(session, spends)
        config = queues.load_queue_config(session)
        queues.record_usage(session, usage, now, config.half_life_seconds)

    # 5 ---------------------------------------------------------------------------------------------
    def _launch_wait_budget(self) -> float:
        """Seconds one job's launch may wait between transient retries in a cycle (the rest of a longer
        backoff is a block on the offer, so one throttled job never holds the cycle for minutes)."""
        return float(self.state.settings.launch_retry_wait_seconds)

    def _provision(self, placed: list[tuple[QueuedJob, list[PlacementOption]]]) -> tuple[int, int]:
        if not placed:
            return 0, 0
        outcomes = self._launch_all(placed)
        now = self.clock.now()
        ok = backoff = 0
        orphans: list[tuple[str, list[str], str]] = []
        transitions: list[Transition] = []
        with self._tx() as session:
            live = self._lock_rows(session, [j.id for j, *_ in outcomes], JobState.PROVISIONING)
            attempt_rows: list[dict[str, Any]] = []
            for job, request_id, outcome in outcomes:
                attempt_rows.extend(self._attempt_row(job.id, request_id, a, now) for a in outcome.attempts)
                if job.id not in live:  # cancelled meanwhile: give back what was launched
                    if outcome.ok and outcome.option is not None:
                        orphans.append((outcome.option.provider, [i.id for i in outcome.instances], request_id))
                    continue
                if outcome.ok and outcome.option is not None:
                    ok += 1
                    opt = outcome.option
                    transitions.append(Transition(
                        job.id, JobState.PROVISIONING, JobState.RUNNING,
                        reason=f"launched on {opt.provider}:{opt.region} ({opt.instance_type})"
                        + (" [dry-run]" if any(i.dry_run for i in outcome.instances) else "")
                        + (f"; gang of {len(outcome.instances)} nodes" if job.request.nodes > 1 else ""),
                        data={"instances": [i.id for i in outcome.instances]},
                        fields={"instances_json": _instances_json(outcome.instances),
                                "provider": opt.provider, "region": opt.region,
                                "placement_json": _option_json(opt, self._binding(job.id, opt)),
                                "dry_run": any(i.dry_run for i in outcome.instances), "started_at": now},
                    ))
                elif getattr(outcome, "exhausted", False):  # every option tried, each out of its retries
                    from providers.failover import exhausted_reason

                    why = exhausted_reason(outcome.attempts)
                    transitions.append(Transition(job.id, JobState.PROVISIONING, JobState.FAILED, reason=why,
                                                  fields={"message": why, "finished_at": now}))
                else:
                    err = outcome.error
                    transitions.append(self._failure(job.id, job.spec.retry, job.retries, JobState.PROVISIONING,
                                                     f"provisioning failed: {err}",
                                                     retryable=bool(err is not None and err.retryable), now=now))
                    backoff += transitions[-1].to_state is JobState.BACKOFF
            if attempt_rows:
                session.connection().execute(_attempts.insert(), attempt_rows)
            apply_transitions(session, transitions, now=now)
        self._count(transitions)
        for provider, ids, request_id in orphans:
            self.state.terminate_instances(provider, ids, f"{request_id}:cancelled")
        return ok, backoff

    # 5a: launches, several at once -----------------------------------------------------------------
    def _launch_all(self, placed: list[tuple[QueuedJob, list[PlacementOption]]]
                    ) -> list[tuple[QueuedJob, str, Any]]:
        """Launch ``placed`` in waves of :attr:`launch_concurrency` (in order; one job at a time by
        default), the leadership checked before each wave: a replica deposed meanwhile launches nothing
        more, and the next leader adopts or requeues the rest. Returns ``(job, request id, outcome)`` per
        launched job, in ``placed`` order.

        Design choice: waves, not a sliding window, so the lock check stays one round trip per wave and the
        blocklist a wave's capacity errors filled steers the next wave (within a wave, jobs do not see each
        other's errors). Providers' ``launch`` is idempotent per request id; the on-prem, Slurm and dry-run
        pools are safe to call from several threads (each locks its own state, and Slurm runs a client
        command per call); the cloud adapters are tested with waves of 4 against moto and the Azure/GCP fakes
        (``tests/providers/test_providers_broker_jobs.py``). The default of 1 keeps launches one at a time."""
        width = max(1, int(self.launch_concurrency))
        outcomes: list[tuple[QueuedJob, str, Any]] = []
        with contextlib.ExitStack() as stack:
            pool = None
            if width > 1 and len(placed) > 1:
                from concurrent.futures import ThreadPoolExecutor

                pool = stack.enter_context(ThreadPoolExecutor(min(width, len(placed)),
                                                              thread_name_prefix="hb-launch"))
            for start in range(0, len(placed), width):
                if not self.leader.still_leads():  # deposed meanwhile: the next leader adopts or requeues the rest
                    break
                wave = placed[start:start + width]
                if pool is None or len(wave) == 1:
                    done = [self._launch_one(job, options) for job, options in wave]
                else:
                    done = list(pool.map(lambda p: self._launch_one(*p), wave))
                outcomes.extend(o for o in done if o is not None)
                if any(o is None for o in done):
                    break  # shutting down: launch nothing more
        return outcomes

    def _launch_one(self, job: QueuedJob, options: list[PlacementOption]) -> tuple[QueuedJob, str, Any] | None:
        """Launch one placed job on its options (:func:`providers.failover.provision`; a pool's warm instance
        first when the job is bound to one; a gang over several hosts or zones part by part). Never raises a
        provider error: it is in the outcome. ``None`` when a shutdown ended a retry wait: the job stays
        PROVISIONING for the next start's reconciliation."""
        from providers.failover import provision

        request_id = job.request_id or f"{job.id}-r{job.retries}"
        tags = {TAG_JOB: job.id, TAG_NAMESPACE: job.namespace}
        plan = self._gang_plans.get(job.id)

        def launch(opts: list[PlacementOption], count: int) -> Any:
            return provision(opts, self.state.get_provider, request_id=request_id, tags=tags, job=job.spec,
                             retry=job.spec.retry, clock=_RetryClock(self.clock, self._stop),
                             blocklist=self.blocklist, rng=self.rng, count=count,
                             wait_budget_seconds=self._launch_wait_budget())

        try:
            if self._binding(job.id, options[0]) is not None:  # warm pool: run on its instance, else the rest
                outcome = self.warm.launch(job, request_id, tags)
                if not outcome.ok and len(options) > 1:
                    rest = launch(options[1:], 1)
                    outcome = dataclasses.replace(rest, attempts=[*outcome.attempts, *rest.attempts])
            elif plan is not None and len(plan) > 1:  # gang: one launch per host/zone, all or nothing
                outcome = self._launch_gang(job, request_id, plan, options[0])
            else:
                outcome = launch(options, max(1, job.request.nodes))
                outcome = self._whole_gang(job, request_id, outcome)  # gang: never fewer than N running
        except _Stopping:
            log.warning("job %s: stopped while its launch waited to be retried; the next start reconciles it",
                        job.id)
            return None
        for a in outcome.attempts:
            if a.outcome not in ("launched", "skipped"):
                self.metrics.provider_errors.labels(a.provider, a.outcome).inc()
        return job, request_id, outcome

    @staticmethod
    def _attempt_row(job_id: str, request_id: str, a: Attempt, now: datetime) -> dict[str, Any]:
        return {"job_id": job_id, "at": a.at or now, "request_id": request_id, "provider": a.provider,
                "region": a.region, "instance_type": a.instance_type, "capacity": a.capacity,
                "outcome": a.outcome, "message": a.message[:2000], "delay_seconds": a.delay_seconds,
                "retryable": a.retryable}

    @staticmethod
    def _failure(job_id: str, retry: RetryPolicy, retries: int, src: JobState, reason: str, *,
                 retryable: bool, now: datetime, exit_code: int | None = None) -> Transition:
        """BACKOFF with the next delay while retries remain and the failure is retryable, else FAILED."""
        if retryable and retries < retry.backoff_limit:
            delay = job_backoff_seconds(retry, retries)
            return Transition(
                job_id, src, JobState.BACKOFF, reason=f"{reason}; retry {retries + 1}/{retry.backoff_limit} "
                f"in {delay:g}s", fields={"retries": retries + 1, "not_before": now + timedelta(seconds=delay),
                                          "message": reason, "exit_code": exit_code, "instances_json": None},
            )
        return Transition(job_id, src, JobState.FAILED, reason=reason,
                          fields={"message": reason, "finished_at": now, "exit_code": exit_code})

    # 6 ---------------------------------------------------------------------------------------------
    def _poll(self, now: datetime) -> int:
        # edge: device task states come from the store (the gateway writes them), not provider.instances()
        edge_done = self.edge.runner.sweep(now) if self.edge is not None else 0
        with self.store.read() as session:  # first only what tells whether a run changed
            light = list(session.execute(
                sa.select(_jobs.c.id, _jobs.c.provider, _jobs.c.instances_json)
                .where(_jobs.c.state == JobState.RUNNING.value, _jobs.c.cancel_requested_at.is_(None))
            ))
        if self.edge is not None:
            light = [r for r in light if r.provider != "edge"]
        names: set[str] = set()
        onprem: list[str] = []
        for r in light:
            if r.provider:
                names.add(r.provider)
                if r.provider == "onprem":
                    onprem.append(r.id)
        self.log_capture.retain(onprem)  # bounded: running jobs only
        if not light:
            return edge_done
        by_provider: dict[str, dict[str, Instance]] = {}
        for name in names:
            try:
                provider = self.state.get_provider(name)
                by_provider[name] = {i.id: i for i in provider.instances(None)}
                for err in provider.poll_errors():
                    self.metrics.provider_errors.labels(name, err.kind).inc()
            except ProviderError as exc:
                self.metrics.provider_errors.labels(name, exc.kind).inc()
                log.warning("polling %s failed: %s", name, exc)
        changed = self._changed_runs(light, by_provider)
        pool = self.state.providers.get("onprem")
        seen = set(changed)
        for r in light:  # running on-prem runs whose log tails are due: other replicas serve them from the store
            if r.provider == "onprem" and r.id not in seen:
                ids = _instance_ids(r.instances_json)
                if ids and self.log_capture.due(pool, r.id, ids[0]):
                    changed.append(r.id)
        if not changed:
            return edge_done
        running: list[Any] = []
        with self.store.read() as session:
            for start in range(0, len(changed), 900):
                running.extend(session.execute(
                    sa.select(_jobs.c.id, _jobs.c.provider, _jobs.c.instances_json, _jobs.c.retries,
                              _jobs.c.spec_json, _jobs.c.created_at, _jobs.c.started_at, _jobs.c.namespace,
                              _jobs.c.placement_json, _jobs.c.vcpus, _jobs.c.memory_gib, _jobs.c.gpus,
                              _jobs.c.dry_run)
                    .where(_jobs.c.id.in_(changed[start:start + 900]), _jobs.c.state == JobState.RUNNING.value)
                ))
        rank = {job_id: n for n, job_id in enumerate(changed)}
        running.sort(key=lambda r: rank[r.id])  # the order of the first read
        transitions: list[Transition] = []
        to_terminate: list[tuple[str, list[str], str]] = []
        tails_due: list[tuple[str, str]] = []  # running on-prem runs whose log tails are due to be stored
        tails_final: dict[str, str] = {}  # ended on-prem runs: their final tails
        outcomes: list[tuple[str, float]] = []
        charges: dict[str, tuple[Any, float, float]] = {}  # job -> (row, runtime hours, estimate counted)
        for r in running:
            known = by_provider.get(r.provider or "")
            if known is None:
                continue
            ids = _instance_ids(r.instances_json)
            insts = [known.get(i) for i in ids]
            states = {i.state for i in insts if i is not None}
            missing = sum(1 for i in insts if i is None)
            started = utc(r.started_at) if r.started_at else now
            try:
                retry = self._spec(r.id, r.spec_json, utc(r.created_at)).retry
            except SpecError:
                retry = RetryPolicy(backoff_limit=0)
            t: Transition | None = None
            tail = next((i.log_tail for i in insts if i is not None and i.log_tail), "")  # a cloud VM's output
            if ids and not missing and states == {InstanceState.SUCCEEDED} and getattr(r, "dry_run", False):
                # a dry-run job ends SUCCEEDED flagged as simulated (jobs.dry_run), its spend as simulated spend
                t = Transition(r.id, JobState.RUNNING, JobState.SUCCEEDED,
                               reason="simulated run ended [dry-run]: nothing was launched or billed",
                               data={"dry_run": True, "simulated_usd": round(_run_cost(
                                   r.placement_json, max(0.0, (now - started).total_seconds() / 3600.0), 1), 6)},
                               fields={"finished_at": now, "exit_code": 0})
            elif ids and not missing and states == {InstanceState.SUCCEEDED}:
                t = Transition(r.id, JobState.RUNNING, JobState.SUCCEEDED, reason="all instances succeeded",
                               data={"exit_code": 0, "log_tail": tail} if tail else None,
                               fields={"finished_at": now, "exit_code": 0})
            elif InstanceState.FAILED in states:
                code = next((i.exit_code for i in insts if i is not None and i.state is InstanceState.FAILED), None)
                t = self._failure(r.id, retry, r.retries, JobState.RUNNING, f"run failed (exit code {code})",
                                  retryable=True, now=now, exit_code=code)
                if tail:
                    t = dataclasses.replace(t, data={"exit_code": code, "log_tail": tail})
            elif InstanceState.TERMINATED in states:
                t = self._failure(r.id, retry, r.retries, JobState.RUNNING,
                                  "instance terminated by the provider (reclaimed?)", retryable=True, now=now)
            elif missing and (now - started).total_seconds() > LOST_INSTANCE_GRACE_SECONDS:
                t = self._failure(r.id, retry, r.retries, JobState.RUNNING,
                                  f"{missing} instance(s) no longer known to {r.provider}", retryable=True, now=now)
            if r.provider == "onprem" and ids and not missing:
                if t is not None:
                    tails_final[r.id] = ids[0]
                elif self.log_capture.due(pool, r.id, ids[0]):
                    tails_due.append((r.id, ids[0]))
            if t is not None:
                transitions.append(t)
                # every known instance: a cloud VM that stopped (GCE, Azure) still bills its disk until deleted
                live_ids = [i.id for i in insts if i is not None]
                if live_ids:
                    to_terminate.append((r.provider, live_ids, f"{r.id}:done"))
                hours = max(0.0, (now - started).total_seconds() / 3600.0)
                if t.to_state is JobState.SUCCEEDED or t.to_state is JobState.FAILED:
                    outcomes.append((r.id, hours))
                    charges[r.id] = (r, hours, _estimate_usd(r.placement_json))
                else:  # BACKOFF: placed and priced anew later, so this run is charged in full
                    charges[r.id] = (r, hours, 0.0)
        if tails_due:  # other replicas serve these runs' logs from the store (broker.job_logs)
            with self._tx() as session:
                for job_id, iid in tails_due:
                    self.log_capture.capture(session, pool, job_id, iid, now=now, ended=False)
        if not transitions:
            return edge_done
        with self._tx() as session:
            live = self._lock_rows(session, [t.job_id for t in transitions], JobState.RUNNING, cancelling=False)
            transitions = [t for t in transitions if t.job_id in live]
            apply_transitions(session, transitions, now=now)
            for job_id, iid in tails_final.items():
                if job_id in live:
                    self.log_capture.capture(session, pool, job_id, iid, now=now, ended=True)
            try:
                from broker.decisions import record_outcomes

                record_outcomes(session, [(job_id, hours) for job_id, hours in outcomes if job_id in live], now)
            except ImportError:  # pragma: no cover
                pass
            self.charge_runs(session, [c for job_id, c in charges.items() if job_id in live], now)
        self._count(transitions)
        for provider, ids, request_id in to_terminate:
            self.state.terminate_instances(provider, ids, request_id)
        return len(transitions) + edge_done

    @staticmethod
    def _changed_runs(light: list[Any], by_provider: dict[str, dict[str, Instance]]) -> list[str]:
        """Ids of the RUNNING jobs step 6 must look at, in ``light``'s order: a job whose instances are all
        known and none ended (succeeded, failed, terminated) gets no transition there."""
        ended = (InstanceState.SUCCEEDED, InstanceState.FAILED, InstanceState.TERMINATED)
        changed = []
        for r in light:  # plain loops: this runs over every running job each cycle
            known = by_provider.get(r.provider or "")
            if known is None:
                continue
            for iid in _instance_ids(r.instances_json):
                i = known.get(iid)
                if i is None or i.state in ended:
                    changed.append(r.id)
                    break
        return changed

    # 7 ---------------------------------------------------------------------------------------------
    def _requeue(self, now: datetime) -> int:
        with self.store.read() as session:
            ids = list(session.execute(
                sa.select(_jobs.c.id).where(_jobs.c.state == JobState.BACKOFF.value,
                                            sa.or_(_jobs.c.not_before.is_(None), _jobs.c.not_before <= now))
                .limit(self.batch)
            ).scalars())
        if not ids:
            return 0
        with self._tx() as session:
            live = self._lock_rows(session, ids, JobState.BACKOFF)
            transitions = [Transition(i, JobState.BACKOFF, JobState.PENDING, reason="backoff over: requeued")
                           for i in ids if i in live]
            apply_transitions(session, transitions, now=now)
        self._count(transitions)
        return len(transitions)

    def _sweep(self, now: datetime) -> None:
        from providers.sweeper import Sweeper

        if not hasattr(self, "sweeper"):
            self.sweeper = Sweeper.from_env()
        if not self.sweeper.due(now):
            return

        def active() -> list[str]:
            with self.store.read() as session:
                return list(session.execute(sa.select(_jobs.c.id).where(_jobs.c.state.in_(ACTIVE_STATES))).scalars())

        self.sweeper.maybe_run(self.state.providers, active, now)

    # ------------------------------------------------------------------------------ reconciliation

    def reconcile(self) -> dict[str, int]:
        """Adopt or terminate provider instances by tag, at start and on every takeover (module docstring).

        Providers with ``adopt()`` (the on-prem pool) first re-read runs another broker process started. On
        PostgreSQL a PROVISIONING job without instances entered that state less than
        :data:`broker.leader.TAKEOVER_GRACE_SECONDS` ago is left alone (its launch by the previous leader
        may still land) and reconcile runs again next cycle.

        Returns counts: ``adopted`` (PROVISIONING jobs whose launch did happen), ``requeued`` (active jobs
        whose instances are gone), ``terminated`` (instances of no active job).
        """
        now = self.clock.now()
        counts = {"adopted": 0, "requeued": 0, "terminated": 0}
        found: dict[str, list[Instance]] = {}
        listing_ok: set[str] = set()
        for name, provider in self.state.providers.items():
            try:
                if hasattr(provider, "adopt"):  # on-prem: runs a previous leader started in the shared data dir
                    provider.adopt()
                for inst in provider.instances(None):
                    if TAG_JOB in inst.tags and (TAG_POOL not in inst.tags or TAG_ON in inst.tags):
                        found.setdefault(inst.tags[TAG_JOB], []).append(inst)  # (a warm pool's own instance
                        # is the pool's, not a job's; a run on it is the job's)
                listing_ok.add(name)
            except Exception as exc:  # noqa: BLE001
                log.warning("reconcile: cannot list instances of %s: %s", name, exc)
        with self.store.read() as session:
            active = {r.id: r for r in session.execute(
                sa.select(_jobs.c.id, _jobs.c.state, _jobs.c.provider, _jobs.c.request_id, _jobs.c.instances_json,
                          _jobs.c.retries, _jobs.c.spec_json, _jobs.c.created_at, _jobs.c.updated_at)
                .where(_jobs.c.state.in_(ACTIVE_STATES))
            )}
        transitions: list[Transition] = []
        terminate: dict[str, list[str]] = {}
        unresolved = 0
        done = (InstanceState.TERMINATED, InstanceState.SUCCEEDED, InstanceState.FAILED)
        for job_id, insts in found.items():
            row = active.get(job_id)
            for inst in insts:
                mine = row is not None and inst.tags.get(TAG_REQUEST) == row.request_id
                if not mine and inst.state not in done:
                    terminate.setdefault(inst.provider, []).append(inst.id)
        for job_id, row in active.items():
            insts = [i for i in found.get(job_id, []) if i.tags.get(TAG_REQUEST) == row.request_id
                     and (i.state not in done or JobState(row.state) is JobState.RUNNING)]  # adopt only live ones
            state = JobState(row.state)
            if state is JobState.PLACED:
                transitions.append(Transition(job_id, state, JobState.PENDING, reason="re-placed after a restart"))
            elif insts:
                if state is JobState.PROVISIONING:
                    counts["adopted"] += 1
                    transitions.append(Transition(
                        job_id, state, JobState.RUNNING, reason="adopted after a restart",
                        fields={"instances_json": _instances_json(insts), "provider": insts[0].provider,
                                "region": insts[0].region, "dry_run": any(i.dry_run for i in insts),
                                "started_at": now},
                    ))
            elif (state is JobState.PROVISIONING and self.store.is_postgres and self.leader.engaged
                  and (now - utc(row.updated_at)).total_seconds() < TAKEOVER_GRACE_SECONDS):
                unresolved += 1  # a previous leader may still be launching it: look again next cycle
            elif row.provider in listing_ok or state is JobState.PROVISIONING:
                counts["requeued"] += 1
                transitions.append(Transition(
                    job_id, state, JobState.BACKOFF, reason="instances lost across a broker restart; requeued",
                    fields={"not_before": now, "instances_json": None},
                ))
        with self._tx() as session:
            apply_transitions(session, transitions, now=now)
        self._count(transitions)
        for provider, ids in terminate.items():
            counts["terminated"] += len(ids)
            self.state.terminate_instances(provider, ids, "reconcile")
        self._reconciled = not unresolved  # reconciled again next cycle while a takeover launch may land
        if any(counts.values()):
            log.info("reconciled at start: %s", counts)
        return counts


