"""Edge devices inside the broker service: capacity for placement, a Provider that dispatches over the
gateway, and the task sink that moves jobs through their lifecycle.

Three pieces, wired by :func:`install_edge` (``create_app`` calls it when ``BROKER_MQTT_URL`` is set):

* :class:`EdgeFleet` turns the device registry into placement input once per scheduling cycle: device
  offers (``AppState.extra_offer_sources``) and device sites with their measured links (``AppState.site_sources``,
  merged into the egress model, so input data size vs a device's bandwidth counts against the deadline).
  :meth:`EdgeFleet.offers_for` narrows them per job: the job's namespace only, devices seen within
  ``offline_after_s`` plus what the job can wait (:meth:`EdgeFleet.wait_allowance_s`), not a lost
  (cordoned) device, not a device that lost this job's task and has not been heard from since, and not a
  device whose open tasks leave too few vCPUs or too little memory for the job (busy slots: the job waits
  for it instead).
* :class:`EdgeProvider` (``providers["edge"]``) is the :class:`providers.base.Provider` of the fleet:
  ``launch`` = :meth:`broker.gateway.Gateway.dispatch` (with an expiry), ``instances`` = the tasks in the
  store, ``terminate`` = a signed ``cancel`` downlink. The gateway's ``job_id`` of a task is the broker's
  request id (``<job id>-r<n>``), so every task names the attempt it belongs to.
* :class:`EdgeRunner` is the gateway's :class:`broker.gateway.TaskSink` (fast path) and the scheduler's
  poll step for edge jobs (:meth:`EdgeRunner.sweep`, the safety net that reads task states from the store).
  Both go through :meth:`EdgeRunner.settle`: ``SUCCEEDED`` -> SUCCEEDED, ``FAILED`` -> BACKOFF/FAILED by
  the job's retry policy, ``LOST``/``REFUSED``/``CANCELLED`` -> PENDING (re-placed, retries untouched),
  each one :func:`broker.lifecycle.transition` (one event row, same transaction). An outcome is applied
  only while the job is RUNNING with that very task as its current instance: a late result of a task the
  broker already gave up on is never applied (the gateway records it in ``edge_tasks.late_outcome``).

Design choice: the store is the truth, the sink only a shortcut. An outcome that reaches the gateway
while the job is still PROVISIONING (a task faster than the scheduler's commit), or whose sink call died
with the process, is applied by the next :meth:`EdgeRunner.sweep`, through the same code.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from broker.clock import Clock
from broker.devices import OFFLINE_AFTER_SECONDS
from broker.errors import BrokerError, CapacityError, InvalidRequestError, SpecError, TransientError
from broker.model import Instance, InstanceState, JobSpec, JobState, Offer, Request
from broker.store import JobEventRow, JobRow, Store, utc

__all__ = [
    "EDGE",
    "EdgeFleet",
    "EdgeProvider",
    "EdgeRunner",
    "EdgeService",
    "install_edge",
    "parse_mqtt_url",
    "job_of_request",
    "DEFAULT_WAIT_SECONDS",
    "MAX_WAIT_SECONDS",
    "MIN_TASK_TTL_SECONDS",
]

log = logging.getLogger("broker.edge")

EDGE = "edge"
DEFAULT_WAIT_SECONDS = 600.0  # how long a job without a deadline may wait for an offline device
MAX_WAIT_SECONDS = 3600.0  # no job waits longer for a device, whatever its deadline
MIN_TASK_TTL_SECONDS = 60.0  # a dispatched task stays deliverable at least this long
RESULT_VALUES_SHOWN = 100  # streamed result values copied into the job's final event
_OPEN_TASK = ("dispatched", "running")
_GIVEN_UP = ("lost", "refused", "cancelled")
_TASK_STATE = {"dispatched": InstanceState.PENDING, "running": InstanceState.RUNNING,
               "succeeded": InstanceState.SUCCEEDED, "failed": InstanceState.FAILED,
               "lost": InstanceState.TERMINATED, "refused": InstanceState.TERMINATED,
               "cancelled": InstanceState.TERMINATED}
_SINK_OF_TASK = {"succeeded": "SUCCEEDED", "failed": "FAILED", "lost": "LOST", "refused": "REFUSED",
                 "cancelled": "CANCELLED"}

_jobs = JobRow.__table__  # type: ignore[attr-defined]


def job_of_request(request_id: str) -> str:
    """The job id of a request id ``<job id>-r<n>`` (the request id itself when it has no such suffix)."""
    head, sep, tail = request_id.rpartition("-r")
    return head if sep and tail.isdigit() else request_id


def parse_mqtt_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of ``mqtts://host[:port]`` (port 8883 by default).

    Raises :class:`SpecError` (field ``BROKER_MQTT_URL``) for another scheme or a malformed URL: the
    gateway only speaks MQTT over mutual TLS."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("mqtts", "ssl", "tls") or not parts.hostname:
        raise SpecError("BROKER_MQTT_URL", f"{url!r} is not an mqtts:// URL. To fix: set it like "
                                           "mqtts://mqtt.example:8883 (the gateway uses mutual TLS only)")
    try:
        port = parts.port or 8883
    except ValueError:
        raise SpecError("BROKER_MQTT_URL", f"{url!r} has an invalid port. To fix: use a port in 1-65535") from None
    return parts.hostname, port


# ---------------------------------------------------------------------------------------------- fleet
def _task_footprint(body_json: str) -> tuple[float, float]:
    """``(vCPUs, memory GiB)`` a dispatched task holds on its device, from its ``task`` body (1 vCPU when
    the body predates the ``vcpus`` field)."""
    try:
        body = json.loads(body_json)
        return float(body.get("vcpus") or 1.0), float(body.get("memory_mib") or 0) / 1024.0
    except (ValueError, TypeError, AttributeError):
        return 1.0, 0.0


@dataclass(frozen=True)
class _Device:
    namespace: str
    last_seen: datetime | None
    labels: Mapping[str, str] = field(default_factory=dict)
    revoked: bool = False


@dataclass
class _FleetView:
    at: datetime | None = None
    offers: list[Offer] = field(default_factory=list)
    sites: list[Any] = field(default_factory=list)
    devices: dict[str, _Device] = field(default_factory=dict)
    # job id -> {device id: when its task there was given up (lost/refused)}
    given_up: dict[str, dict[str, datetime]] = field(default_factory=dict)
    # device id -> [vCPUs, memory GiB] its open tasks hold (refreshed per cycle, plus this cycle's launches)
    busy: dict[str, list[float]] = field(default_factory=dict)


class EdgeFleet:
    """The device registry as placement input (see the module docstring).

    ``offline_after_s`` is when a silent device counts as offline (the gateway's setting);
    ``default_wait_s`` how long a job without a deadline may wait for an offline device; ``max_wait_s``
    caps any job's wait. ``lost_after_s`` (``BROKER_DEVICE_LOST_AFTER_SECONDS``; ``None``: off) cordons a
    device silent for longer: the health monitor has re-placed its jobs, and no job is placed on it or waits
    for it until it is heard from again. :meth:`refresh` reads the store (three queries) and is what the scheduler's
    snapshot calls once per cycle; :meth:`sites` and :meth:`offers_for` use the last refresh only.
    """

    def __init__(self, store: Store, clock: Clock, *, offline_after_s: float = OFFLINE_AFTER_SECONDS,
                 default_wait_s: float = DEFAULT_WAIT_SECONDS, max_wait_s: float = MAX_WAIT_SECONDS,
                 lost_after_s: float | None = None) -> None:
        self.store = store
        self.clock = clock
        self.offline_after_s = offline_after_s
        self.lost_after_s = lost_after_s
        self.default_wait_s = default_wait_s
        self.max_wait_s = max_wait_s
        self._view = _FleetView()
        self._lock = threading.Lock()

    def refresh(self, now: datetime | None = None) -> list[Offer]:
        """Re-read the registry; returns every device offer any job could use (each job gets a subset)."""
        from broker import devices

        now = now or self.clock.now()
        with self.store.read() as s:
            offers = devices.device_offers(s, now, max_offline_s=self.max_wait_s)
            sites = devices.device_sites(s, now, max_offline_s=self.max_wait_s)
            known = {d.id: _Device(d.namespace, None if d.last_seen is None else utc(d.last_seen),
                                   devices.device_labels(d), d.revoked_at is not None)
                     for d in devices.list_devices(s)}
            tasks = devices.EdgeTaskRow.__table__  # type: ignore[attr-defined]
            given_up: dict[str, dict[str, datetime]] = {}
            for request_id, device_id, at in s.execute(
                sa.select(tasks.c.job_id, tasks.c.device_id, tasks.c.updated_at)
                .where(tasks.c.state.in_(("lost", "refused")),
                       tasks.c.updated_at >= now - timedelta(seconds=self.max_wait_s + self.offline_after_s))
            ):
                per_job = given_up.setdefault(job_of_request(request_id), {})
                at = utc(at)
                per_job[device_id] = max(at, per_job.get(device_id, at))
            busy: dict[str, list[float]] = {}
            for device_id, body in s.execute(sa.select(tasks.c.device_id, tasks.c.body)
                                             .where(tasks.c.state.in_(_OPEN_TASK))):
                held = busy.setdefault(device_id, [0.0, 0.0])
                for i, v in enumerate(_task_footprint(body)):
                    held[i] += v
        view = _FleetView(at=now, offers=offers, sites=sites, devices=known, given_up=given_up, busy=busy)
        with self._lock:
            self._view = view
        return list(offers)

    def namespace_of(self, device_id: str) -> str | None:
        """The namespace of ``device_id`` as of the last :meth:`refresh` (``None``: unknown)."""
        dev = self._view.devices.get(device_id)
        return None if dev is None else dev.namespace

    def reserve(self, device_id: str, vcpus: float, memory_gib: float) -> None:
        """Count a job just placed on ``device_id`` as holding its slots until the next :meth:`refresh` (the
        scheduler calls it per decision, so one cycle does not place more on a device than it has)."""
        with self._lock:
            held = self._view.busy.setdefault(device_id, [0.0, 0.0])
            held[0] += vcpus
            held[1] += memory_gib

    def offers(self) -> list[Offer]:
        """:meth:`refresh` at the clock's now (the ``AppState.extra_offer_sources`` entry)."""
        return self.refresh()

    def sites(self) -> list[Any]:
        """The device sites of the last refresh (the ``AppState.site_sources`` entry; no I/O)."""
        return list(self._view.sites)

    def wait_allowance_s(self, request: Request, now: datetime) -> float:
        """Seconds ``request`` can wait for a device: the slack before its deadline (deadline - now -
        duration), else ``default_wait_s``; never below 0 nor above ``max_wait_s``."""
        if request.deadline is not None:
            slack = (utc(request.deadline) - now).total_seconds() - request.duration_hours * 3600.0
        else:
            slack = self.default_wait_s
        return max(0.0, min(self.max_wait_s, slack))

    def offers_for(self, job_id: str, namespace: str, request: Request, offers: Sequence[Offer],
                   now: datetime) -> tuple[list[Offer], tuple[str, ...], tuple[str, ...]]:
        """The subset of ``offers`` job ``job_id`` may use, a signature of the devices kept (a cache key
        for equal requests), and the devices it would rather wait for.

        Non-edge offers pass (a job with a ``node_selector`` has only edge in its providers). A device offer
        passes when the device carries every label of the request's ``node_selector``, is in ``namespace``,
        was seen within
        ``offline_after_s + wait_allowance_s``, and did not lose this job's task without being heard from
        since. A device left out only for that last reason, still within the job's wait, is "waited for":
        the scheduler holds the job instead of failing it when nothing else is feasible."""
        view = self._view
        wait_s = self.wait_allowance_s(request, now)
        lost_here = view.given_up.get(job_id, {})
        kept: list[Offer] = []
        devices: list[str] = []
        waiting: list[str] = []
        for o in offers:
            if o.location.provider != EDGE:
                kept.append(o)
                continue
            dev = view.devices.get(o.location.region)
            if dev is None or dev.namespace != namespace or dev.last_seen is None:
                continue
            if any(dev.labels.get(k) != v for k, v in request.node_selector):
                continue
            silent = (now - dev.last_seen).total_seconds()
            if silent > self.offline_after_s + wait_s:
                continue
            if self.lost_after_s is not None and silent > self.lost_after_s:
                waiting.append(o.location.region)  # cordoned: lost (its jobs re-placed) until heard from again
                continue
            gave_up_at = lost_here.get(o.location.region)
            if gave_up_at is not None and dev.last_seen <= gave_up_at:
                waiting.append(o.location.region)
                continue
            held_cpu, held_mem = view.busy.get(o.location.region, (0.0, 0.0))
            it = o.instance_type
            if held_cpu and (request.vcpus > it.vcpus - held_cpu + 1e-9
                             or request.memory_gib > it.memory_gib - held_mem + 1e-9):
                waiting.append(o.location.region)  # busy: its running tasks leave too little room
                continue
            kept.append(o)
            devices.append(o.location.region)
        return kept, tuple(sorted(devices)), tuple(sorted(waiting))


    def unmatched_selector(self, namespace: str, request: Request) -> str | None:
        """Why a job with a ``node_selector`` that found no placement waits (it stays PENDING, as a pod
        whose nodeSelector matches no node does): no device of ``namespace`` carries those labels, or how
        many do and that none of them fits now. ``None`` for a job without a selector."""
        if not request.node_selector:
            return None
        want = ", ".join(f"{k}={v}" for k, v in request.node_selector)
        matching = [i for i, d in self._view.devices.items() if d.namespace == namespace and not d.revoked
                    and all(d.labels.get(k) == v for k, v in request.node_selector)]
        if not matching:
            return (f"no edge device in namespace {namespace} matches nodeSelector {want}. To fix: label a "
                    "device (broker devices label DEVICE key=value) or change the selector")
        return (f"{len(matching)} edge device(s) match nodeSelector {want} ({', '.join(sorted(matching)[:5])}), "
                "but none is online with room for the job now")


# ---------------------------------------------------------------------------------------------- provider
class EdgeProvider:
    """The fleet as a :class:`providers.base.Provider` named ``edge`` (see the module docstring).

    Idempotent per ``request_id`` and device: a launch returns the task already dispatched for them unless
    it was given up (lost, refused, cancelled), in which case a new task (``<request>.<n+1>``) is sent.
    ``gateway`` may be ``None`` (no MQTT): then launch raises :class:`TransientError`."""

    name = EDGE

    def __init__(self, store: Store, gateway: Any, fleet: EdgeFleet, clock: Clock) -> None:
        from providers.base import Capability

        self.capabilities = frozenset({Capability.RUNS_WORK, Capability.TAGS, Capability.GPUS})
        self.store = store
        self.gateway = gateway
        self.fleet = fleet
        self.clock = clock

    def offers(self) -> list[Offer]:
        return self.fleet.refresh()

    @staticmethod
    def _to_instance(row: Any) -> Instance:
        request_id = str(row.job_id)
        return Instance(
            id=row.task_id, provider=EDGE, region=row.device_id, instance_type=f"edge-{row.device_id}",
            state=_TASK_STATE.get(row.state, InstanceState.UNKNOWN),
            tags={"hb-job": job_of_request(request_id), "hb-request": request_id},
            exit_code=row.exit_code, launched_at=utc(row.dispatched_at),
        )

    def _tasks(self, where: Any) -> list[Any]:
        from broker.devices import EdgeTaskRow

        tasks = EdgeTaskRow.__table__  # type: ignore[attr-defined]
        with self.store.read() as s:
            return list(s.execute(sa.select(tasks).where(where).order_by(tasks.c.dispatched_at, tasks.c.task_id)))

    def launch(self, offer: Offer, count: int, request_id: str, *, tags: Mapping[str, str],
               job: JobSpec | None = None) -> list[Instance]:
        """Dispatch ``job`` to the device ``offer.location.region`` as one task expiring after the job's
        wait allowance (at least :data:`MIN_TASK_TTL_SECONDS`). Raises :class:`InvalidRequestError` for
        ``count != 1`` or no job, :class:`CapacityError` for an unknown or revoked device,
        :class:`TransientError` when the gateway is not running."""
        from broker.devices import EdgeTaskRow
        from broker.errors import NotFoundError

        device = offer.location.region
        if count != 1:
            raise InvalidRequestError(f"an edge device runs one task per job, not {count}. To fix: set "
                                      "nodes: 1 or leave edge out of placement.providers",
                                      provider=EDGE, region=device, request_id=request_id)
        if job is None:
            raise InvalidRequestError("an edge launch needs the job spec (its command)", provider=EDGE,
                                      region=device, request_id=request_id)
        t = EdgeTaskRow.__table__  # type: ignore[attr-defined]
        mine = sa.and_(t.c.job_id == request_id, t.c.device_id == device)
        kept = [r for r in self._tasks(mine) if r.state not in _GIVEN_UP]
        if kept:
            return [self._to_instance(kept[-1])]
        if self.gateway is None:
            raise TransientError("the edge gateway is not running. To fix: set BROKER_MQTT_URL and start "
                                 "Mosquitto", provider=EDGE, region=device, request_id=request_id)
        now = self.clock.now()
        ttl = max(MIN_TASK_TTL_SECONDS, self.fleet.wait_allowance_s(job.request, now))
        try:
            self.gateway.dispatch(device, request_id, job, now + timedelta(seconds=ttl))
        except NotFoundError as exc:
            raise CapacityError(str(exc), provider=EDGE, region=device, request_id=request_id) from None
        rows = [r for r in self._tasks(mine) if r.state not in _GIVEN_UP]
        if not rows:  # pragma: no cover - dispatch writes the row before it publishes
            raise TransientError(f"task for {request_id} on {device} not recorded", provider=EDGE, region=device)
        return [self._to_instance(rows[-1])]

    def instances(self, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """Tasks still open, or ended within the last day, whose tags include ``tags``."""
        from broker.devices import EdgeTaskRow
        from providers.base import matches_tags

        t = EdgeTaskRow.__table__  # type: ignore[attr-defined]
        since = self.clock.now() - timedelta(days=1)
        where = sa.or_(t.c.state.in_(_OPEN_TASK), t.c.updated_at >= since)
        if tags and tags.get("hb-request"):
            where = sa.and_(where, t.c.job_id == tags["hb-request"])
        return [i for i in map(self._to_instance, self._tasks(where)) if matches_tags(i.tags, tags)]

    def terminate(self, ids: Sequence[str], request_id: str) -> None:
        """Send a ``cancel`` for each task still open (finished or unknown ids are ignored).

        A fence (``request_id`` ``<job>:fenced``: the health monitor found the device silent past
        ``BROKER_DEVICE_LOST_AFTER_SECONDS``) also marks the tasks ``lost`` at once, as the gateway does after
        ``replace_after_s``: the re-placed job is not sent back to that device until it is heard from again,
        and the device's late outcome is only recorded (``late_outcome``)."""
        from broker.devices import EdgeTaskRow

        t = EdgeTaskRow.__table__  # type: ignore[attr-defined]
        where = sa.and_(t.c.task_id.in_(list(ids)), t.c.state.in_(_OPEN_TASK))
        if not ids:
            return
        open_rows = self._tasks(where)
        if request_id.endswith(":fenced") and open_rows:
            with self.store.tx() as s:
                s.execute(sa.update(t).where(where).values(state="lost", updated_at=self.clock.now()))
        if self.gateway is None:
            return
        for row in open_rows:
            self.gateway.send(row.device_id, "cancel", {"task_id": row.task_id})

    def poll_errors(self) -> list[Any]:
        return []


# ---------------------------------------------------------------------------------------------- runner
class EdgeRunner:
    """Applies device task outcomes to jobs (the gateway's ``TaskSink`` and the scheduler's edge poll).

    ``on_change`` (optional) is called with ``(job_id, to_state)`` after each committed transition
    (metrics). ``charge`` (optional) charges ended runs to budgets and fair-share usage in the same
    transaction, with the scheduler's ``charge_runs(session, [(row, hours, estimate_usd)], now)``."""

    def __init__(self, store: Store, clock: Clock, *,
                 on_change: Callable[[str, JobState], None] | None = None,
                 charge: Callable[[Any, list[tuple[Any, float, float]], datetime], None] | None = None) -> None:
        self.store = store
        self.clock = clock
        self.on_change = on_change
        self.charge = charge
        # tasks of RUNNING jobs whose "started task" note is written (or known to be): a device's running
        # report can arrive before the scheduler commits the job RUNNING, and the sweep then notes it
        self._noted: set[str] = set()

    # TaskSink -------------------------------------------------------------------------------------
    def task_status(self, job_id: str, state: str, exit_code: int | None, detail: Mapping[str, Any]) -> None:
        """Gateway callback (``job_id`` is the request id). Never raises: the sweep retries what fails."""
        if state == "PROBE":
            try:
                self.probe_report(job_id, detail)
            except Exception:  # noqa: BLE001 - a probe report is best effort; the next one follows
                log.exception("probe report of %s not stored", job_id)
            return
        try:
            self.settle(job_id, str(detail.get("task_id") or ""), state, exit_code,
                        reason=str(detail.get("reason") or ""))
        except Exception:  # noqa: BLE001 - the gateway must keep going; the store keeps the truth
            log.exception("edge outcome %s of %s not applied now; the scheduler's sweep will", state, job_id)

    def probe_report(self, request_id: str, detail: Mapping[str, Any], now: datetime | None = None) -> bool:
        """Store a device's probe result for the job's current run in ``probe_states`` (as the health monitor
        does for on-prem and cloud runs), and a note event when the device restarted the task after its
        liveness probe failed. Ignored (False) unless the job is RUNNING that very task."""
        from broker.lifecycle import note
        from broker.ops.store import ProbeStateRow

        now = now or self.clock.now()
        job_id = job_of_request(request_id)
        task_id = str(detail.get("task_id") or "")
        probes = ProbeStateRow.__table__  # type: ignore[attr-defined]
        with self.store.tx() as s:
            row = s.execute(sa.select(_jobs.c.state, _jobs.c.request_id, _jobs.c.instances_json)
                            .where(_jobs.c.id == job_id)).one_or_none()
            if (row is None or row.state != JobState.RUNNING.value or row.request_id != request_id
                    or task_id not in _instance_ids(row.instances_json)):
                return False
            name = str(detail.get("probe"))
            s.execute(sa.delete(probes).where(probes.c.job_id == job_id, probes.c.probe == name))
            s.execute(sa.insert(probes).values(
                job_id=job_id, probe=name, request_id=request_id, failures=int(detail.get("failures") or 0),
                successes=int(detail.get("successes") or 0), ready=bool(detail.get("ready")), last_at=now,
                message=str(detail.get("message") or "")))
            if detail.get("restarted"):
                device = detail.get("device")
                note(s, job_id, JobState.RUNNING,
                     f"edge device {device} restarted task {task_id} (restart {detail.get('restarts')}): "
                     f"{detail.get('message')}", now=now,
                     data={"device": device, "task_id": task_id, "restarts": detail.get("restarts"),
                           "probe": name})
        return True

    # one outcome ------------------------------------------------------------------------------------
    def settle(self, request_id: str, task_id: str, state: str, exit_code: int | None, *, reason: str = "",
               now: datetime | None = None) -> JobState | None:
        """Apply one task outcome (sink state names) to its job; returns the job's new state, or ``None``
        when nothing changed (a late or foreign outcome, or the job is not RUNNING any more).

        ``RUNNING`` only adds a note event."""
        from broker.lifecycle import note, transition
        from broker.scheduler import Scheduler

        now = now or self.clock.now()
        job_id = job_of_request(request_id)
        with self.store.tx() as s:
            stmt = sa.select(_jobs.c.id, _jobs.c.namespace, _jobs.c.state, _jobs.c.request_id,
                             _jobs.c.instances_json, _jobs.c.retries, _jobs.c.spec_json, _jobs.c.created_at,
                             _jobs.c.started_at, _jobs.c.placement_json, _jobs.c.vcpus, _jobs.c.memory_gib,
                             _jobs.c.gpus).where(_jobs.c.id == job_id)
            if self.store.is_postgres:
                stmt = stmt.with_for_update()
            row = s.execute(stmt).one_or_none()
            if (row is None or row.state != JobState.RUNNING.value or row.request_id != request_id
                    or task_id not in _instance_ids(row.instances_json)):
                return None
            device = self._device_of(s, task_id)
            where = f"edge device {device}"
            if state == "RUNNING":
                reason = f"{where} started task {task_id}"
                ev = JobEventRow.__table__  # type: ignore[attr-defined]
                if task_id not in self._noted and s.execute(sa.select(ev.c.id).where(
                        ev.c.job_id == job_id, ev.c.reason == reason).limit(1)).first() is None:
                    note(s, job_id, JobState.RUNNING, reason, now=now, data={"device": device, "task_id": task_id})
                self._noted.add(task_id)
                return None
            data = self._outcome_data(s, device, task_id, exit_code)
            if state == "SUCCEEDED":
                to = JobState.SUCCEEDED
                transition(s, job_id, to, now=now, expected=JobState.RUNNING, lock=False,
                           reason=f"succeeded on {where} (exit code {exit_code})", data=data,
                           finished_at=now, exit_code=exit_code, message=None)
                self._record_outcome(s, job_id, row.started_at, now)
            elif state == "FAILED":
                retry = _retry_of(row)
                t = Scheduler._failure(job_id, retry, row.retries, JobState.RUNNING,
                                       f"run failed on {where} (exit code {exit_code})", retryable=True,
                                       now=now, exit_code=exit_code)
                to = t.to_state
                transition(s, job_id, to, now=now, expected=JobState.RUNNING, lock=False, reason=t.reason,
                           data=data, **t.fields)
                if to is JobState.FAILED:
                    self._record_outcome(s, job_id, row.started_at, now)
            elif state in ("LOST", "REFUSED", "CANCELLED"):
                to = JobState.PENDING
                why = {"LOST": f"{where} lost the task ({reason or 'device offline'})",
                       "REFUSED": f"{where} refused the task ({reason or 'expired'})",
                       "CANCELLED": f"{where} cancelled the task"}[state]
                transition(s, job_id, to, now=now, expected=JobState.RUNNING, lock=False,
                           reason=f"{why}; re-placing", data=data, instances_json=None, held_reason=None,
                           message=why)
            else:
                log.warning("unknown edge task state %r for %s", state, task_id)
                return None
            self._charge(s, row, to, now)
        if self.on_change is not None:
            self.on_change(job_id, to)
        return to

    def _charge(self, s: Any, row: Any, to: JobState, now: datetime) -> None:
        """Charge the ended run like the scheduler charges others: a finished run against its placement's
        estimate; a run that goes back to the queue (BACKOFF, lost, refused) in full, as it is priced anew."""
        if self.charge is None:
            return
        from broker.scheduler import _estimate_usd

        started = utc(row.started_at) if row.started_at else now
        hours = max(0.0, (now - started).total_seconds() / 3600.0)
        estimate = _estimate_usd(row.placement_json) if to in (JobState.SUCCEEDED, JobState.FAILED) else 0.0
        self.charge(s, [(row, hours, estimate)], now)

    @staticmethod
    def _device_of(s: Any, task_id: str) -> str:
        from broker.devices import EdgeTaskRow

        task = s.get(EdgeTaskRow, task_id)
        return task.device_id if task is not None else "?"

    @staticmethod
    def _outcome_data(s: Any, device: str, task_id: str, exit_code: int | None) -> dict[str, Any]:
        """What the job's event shows of a task's outcome: device, task, exit code, output tails and the
        first :data:`RESULT_VALUES_SHOWN` streamed result values (``@hb-result`` lines)."""
        from broker.devices import UplinkRow

        up = UplinkRow.__table__  # type: ignore[attr-defined]
        data: dict[str, Any] = {"device": device, "task_id": task_id, "exit_code": exit_code}
        final = s.execute(sa.select(up.c.body).where(up.c.device_id == device, up.c.kind == "result",
                                                     up.c.msg_id == f"{task_id}/final")).scalar()
        if final:
            body = json.loads(final)
            data.update({k: body[k] for k in ("stdout_tail", "stderr_tail", "error") if body.get(k)})
            data["results_count"] = int(body.get("results") or 0)
        prefix = task_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "/r%"
        values = s.execute(
            sa.select(up.c.body).where(up.c.device_id == device, up.c.kind == "result",
                                       up.c.msg_id.like(prefix, escape="\\"))
            .order_by(up.c.seq).limit(RESULT_VALUES_SHOWN)
        ).scalars()
        results = [json.loads(v).get("value") for v in values]
        if results:
            data["results"] = results
        return data

    @staticmethod
    def _record_outcome(s: Any, job_id: str, started_at: datetime | None, now: datetime) -> None:
        try:
            from broker.decisions import record_outcome
        except ImportError:  # pragma: no cover - the reports area is optional
            return
        started = utc(started_at) if started_at else now
        record_outcome(s, job_id, max(0.0, (now - started).total_seconds() / 3600.0), now)

    # the sweep ------------------------------------------------------------------------------------
    def sweep(self, now: datetime) -> int:
        """Apply every ended task of a RUNNING edge job that the sink has not applied (the scheduler's
        poll step for ``provider == "edge"``). Returns how many jobs changed state."""
        from broker.devices import EdgeTaskRow

        with self.store.read() as s:
            running = list(s.execute(
                sa.select(_jobs.c.id, _jobs.c.request_id, _jobs.c.instances_json)
                .where(_jobs.c.state == JobState.RUNNING.value, _jobs.c.provider == EDGE)
            ))
            current = {ids[-1]: r.request_id for r in running if (ids := _instance_ids(r.instances_json))}
            ended: list[tuple[str, str, int | None]] = []
            started: list[str] = []  # running on the device, start not noted on the job yet
            t = EdgeTaskRow.__table__  # type: ignore[attr-defined]
            keys = list(current)
            self._noted &= set(keys)  # bounded: tasks of RUNNING edge jobs only
            for start in range(0, len(keys), 500):
                for task_id, state, code in s.execute(
                    sa.select(t.c.task_id, t.c.state, t.c.exit_code)
                    .where(t.c.task_id.in_(keys[start:start + 500]),
                           t.c.state.in_([*_SINK_OF_TASK, "running"]))
                ):
                    if state == "running":
                        if task_id not in self._noted:
                            started.append(task_id)
                    else:
                        ended.append((task_id, state, code))
        for task_id in started:  # settle notes it once (it checks the job's events under the row lock)
            try:
                self.settle(current[task_id], task_id, "RUNNING", None, now=now)
            except BrokerError as exc:
                log.info("edge sweep: %s", exc)
        changed = 0
        for task_id, state, code in ended:
            try:
                if self.settle(current[task_id], task_id, _SINK_OF_TASK[state], code, now=now) is not None:
                    changed += 1
            except BrokerError as exc:  # a concurrent change: the next sweep sees the new state
                log.info("edge sweep: %s", exc)
        return changed


def _instance_ids(text: str | None) -> list[str]:
    if not text:
        return []
    return [i["id"] if isinstance(i, dict) else str(i) for i in json.loads(text)]


def _retry_of(row: Any) -> Any:
    from broker.model import RetryPolicy
    from broker.spec import parse_job_spec

    try:
        return parse_job_spec(json.loads(row.spec_json), now=utc(row.created_at)).retry
    except (SpecError, ValueError):
        return RetryPolicy(backoff_limit=0)


# ---------------------------------------------------------------------------------------------- wiring
@dataclass
class EdgeService:
    """What :func:`install_edge` wired into an app (``app.state.hb.edge``)."""

    fleet: EdgeFleet
    provider: EdgeProvider
    runner: EdgeRunner
    gateway: Any = None

    def start(self, wait_s: float = 5.0) -> None:
        """Connect the gateway. When Mosquitto does not answer in ``wait_s`` this logs and returns: the
        gateway keeps reconnecting in the background and the API serves meanwhile."""
        if self.gateway is None:
            return
        try:
            self.gateway.start(wait_s=wait_s)
            log.info("edge gateway connected")
        except ConnectionError as exc:
            log.error("%s; retrying in the background", exc)

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()


def build_gateway(settings: Any, store: Store, sink: Any, clock: Clock, **options: Any) -> Any:
    """A :class:`broker.gateway.Gateway` for ``settings.mqtt_url`` with the gateway certificate files of
    ``settings`` (``broker ca init`` writes them to ``<data dir>/ca``). Not started.

    Raises :class:`SpecError` naming the setting when the URL is not mqtts:// or a file is missing."""
    from broker.gateway import Gateway

    host, port = parse_mqtt_url(settings.mqtt_url)
    files = {"BROKER_MQTT_CA_FILE": settings.mqtt_ca_file, "BROKER_MQTT_CERT_FILE": settings.mqtt_cert_file,
             "BROKER_MQTT_KEY_FILE": settings.mqtt_key_file}
    for key, path in files.items():
        if path is None or not Path(path).is_file():
            raise SpecError(key, f"BROKER_MQTT_URL is set but {path} does not exist. To fix: run `broker ca "
                                 f"init` (it writes ca.pem, gateway.pem and gateway.key) or set {key}")
    return Gateway(store, host=host, port=port, ca_file=str(settings.mqtt_ca_file),
                   cert_file=str(settings.mqtt_cert_file), key_file=str(settings.mqtt_key_file), sink=sink,
                   clock=options.pop("clock", clock), **options)


def install_edge(state: Any, *, gateway_options: Mapping[str, Any] | None = None, connect: bool = True,
                 fleet_options: Mapping[str, Any] | None = None) -> EdgeService:
    """Wire the edge into one app's :class:`broker.app.AppState`: ``providers["edge"]``, device offers and
    sites as placement input, the runner as the gateway's sink and the scheduler's edge poll.

    ``connect`` False builds no gateway (placement only; launches then fail as transient).
    ``gateway_options`` go to :class:`broker.gateway.Gateway` (e.g. ``replace_after_s``); the fleet's
    ``offline_after_s`` follows the gateway's. Idempotent per state."""
    existing = getattr(state, "edge", None)
    if isinstance(existing, EdgeService):
        return existing
    from broker.devices import OFFLINE_AFTER_SECONDS as default_offline

    gw_opts = dict(gateway_options or {})
    fl_opts = {"offline_after_s": float(gw_opts.get("offline_after_s", default_offline)),
               "lost_after_s": getattr(state.settings, "device_lost_after_seconds", None), **(fleet_options or {})}
    fleet = EdgeFleet(state.store, state.clock, **fl_opts)
    metrics = getattr(state, "metrics", None)

    def on_change(_job_id: str, to: JobState) -> None:
        if metrics is not None:
            metrics.transitions.labels(to.value).inc()

    def charge(session: Any, runs: list[tuple[Any, float, float]], now: datetime) -> None:
        if state.scheduler is not None:
            state.scheduler.charge_runs(session, runs, now)

    runner = EdgeRunner(state.store, state.clock, on_change=on_change, charge=charge)
    if metrics is not None:
        gw_opts.setdefault("registry", metrics.registry)  # hb_edge_* on the app's /metrics
    gateway = build_gateway(state.settings, state.store, runner, state.clock, **gw_opts) if connect else None
    provider = EdgeProvider(state.store, gateway, fleet, state.clock)
    service = EdgeService(fleet=fleet, provider=provider, runner=runner, gateway=gateway)
    state.providers[EDGE] = provider
    state.extra_offer_sources.append(fleet.offers)
    state.site_sources.append(fleet.sites)
    state.edge = service
    if getattr(state, "scheduler", None) is not None:
        state.scheduler.edge = service
    return service
