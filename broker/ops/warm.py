"""Warm pools in use, and consolidation carried out.

**Binding** (:class:`WarmPools`, the scheduler's ``warm`` hook, step 4): a job of a pool's namespace (and
queue, when the pool names one) goes onto an instance the pool already keeps warm, instead of a new one,
when an instance has room for it (its vCPU and memory minus what the jobs bound to it ask; best fit, so
work packs onto few instances) and the pool's offer passes every placement filter for the job
(:func:`policies.placement.engine.check_offer`: spot policy, arch, price cap, deadline...). The option is
priced at the pool's instance price (:func:`policies.placement.engine.price_offer`), and its explanation and
the decision record say it runs on an instance the pool already pays for. Step 5 starts the job there with
the provider's ``run_on`` (:attr:`providers.base.Capability.WARM_RUNS`; a provider without it keeps its pools
provisioned-only), falling back to the job's other cloud options when that fails. The binding is stored in
the job's placement (``pool``, ``pool_instance``), which is what :func:`pool_load` reads: the autoscaler's
scale-in (:mod:`broker.ops.autoscale`) never removes an instance with work bound to it.

**Consolidation** (:class:`Consolidator`, every cycle after the autoscaler), for a pool whose document sets
``consolidation: {enabled: true}``: :func:`policies.consolidate.plan_consolidation` over the pool's instances
and the RUNNING jobs bound to them; each ``delete`` action whose jobs can all move (a job that is not RUNNING
or has no ``checkpoint`` pins its instance, like Karpenter's do-not-disrupt) is carried out: the jobs' runs
are stopped and the jobs requeued from their last checkpoint with a new request id (the health monitor's
fencing, so an old run never completes the job), the instance is cordoned so the re-placement packs them
onto the instances that stay, and it is terminated and removed from the pool. At most ``maxDisrupted``
instances per action round (the disruption budget), a round only every ``cooldownSeconds``, never below
``minReplicas``, and never when the instances left would pass ``scaleOutUtilization`` (the autoscaler would
scale right out again). Each release is a pool decision (``broker pools list``), a job event per moved
job, a log line and ``hb_consolidation_total``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from broker.errors import SpecError
from broker.model import JobState, PlacementOption
from broker.ops.autoscale import PoolSpec, parse_pool
from broker.ops.store import PoolRow
from broker.store import JobRow

__all__ = ["WarmPools", "Consolidator", "VmLoad", "pool_load", "POOL_KEY", "POOL_INSTANCE_KEY"]

log = logging.getLogger("broker.ops.warm")
POOL_KEY = "pool"  # keys of a bound job's placement_json
POOL_INSTANCE_KEY = "pool_instance"
_ACTIVE = (JobState.PLACED.value, JobState.PROVISIONING.value, JobState.RUNNING.value)
_pools = PoolRow.__table__  # type: ignore[attr-defined]
_jobs = JobRow.__table__  # type: ignore[attr-defined]


@dataclass
class VmLoad:
    """What the jobs bound to one pool instance ask, and which jobs they are (id, state, row)."""

    vcpus: float = 0.0
    memory_gib: float = 0.0
    jobs: list[tuple[str, str, Any]] = field(default_factory=list)


def pool_load(session: Any, providers: Sequence[str]) -> dict[str, VmLoad]:
    """Pool instance id -> the load of the active jobs bound to it (their placement's ``pool_instance``)."""
    from broker.ops.health import _RUN_COLUMNS

    out: dict[str, VmLoad] = {}
    if not providers:
        return out
    rows = session.execute(sa.select(*_RUN_COLUMNS, _jobs.c.state).where(
        _jobs.c.state.in_(_ACTIVE), _jobs.c.provider.in_(list(providers)),
        _jobs.c.placement_json.like(f'%"{POOL_INSTANCE_KEY}"%')))
    for r in rows:
        try:
            vm = json.loads(r.placement_json or "{}").get(POOL_INSTANCE_KEY)
        except (ValueError, AttributeError):
            continue
        if vm:
            load = out.setdefault(str(vm), VmLoad())
            load.vcpus += float(r.vcpus)
            load.memory_gib += float(r.memory_gib)
            load.jobs.append((r.id, r.state, r))
    return out


def _stored_pools(session: Any) -> list[tuple[PoolSpec, list[str], Any]]:
    out = []
    for row in session.execute(sa.select(_pools).order_by(_pools.c.name)):
        try:
            spec = parse_pool(json.loads(row.policy_json), row.name)
        except (SpecError, ValueError):
            continue  # the autoscaler logs it
        out.append((spec, [str(i) for i in json.loads(row.instances_json or "[]")], row))
    return out


def _checkpoints(spec_json: str) -> bool:
    """True when the job's spec has a ``checkpoint`` (it resumes when moved)."""
    try:
        return bool(json.loads(spec_json).get("spec", {}).get("checkpoint"))
    except (ValueError, AttributeError):
        return False


def _warm_capable(state: Any, provider: str) -> bool:
    from providers.base import Capability

    p = state.providers.get(provider)
    return p is not None and hasattr(p, "run_on") and Capability.WARM_RUNS in getattr(p, "capabilities", ())


class WarmPools:
    """The scheduler's warm-pool hook (see the module docstring). ``cordoned`` instances take no new work."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.cordoned: set[str] = set()
        self._pools: list[tuple[PoolSpec, list[str]]] = []
        self._free: dict[str, list[float]] = {}
        self._bound: dict[str, tuple[PlacementOption, dict[str, str]]] = {}

    def begin(self, now: datetime) -> None:
        """Read the pools and what is bound to their instances (once per cycle, before step 4)."""
        self._bound = {}
        with self.state.store.read() as session:
            pools = [(s, ids) for s, ids, _ in _stored_pools(session) if _warm_capable(self.state, s.provider)]
            load = pool_load(session, sorted({s.provider for s, _ in pools})) if pools else {}
        self._pools = pools
        self._free = {}
        for spec, ids in pools:
            for vm in ids:
                used = load.get(vm, VmLoad())
                self._free[vm] = [spec.vcpus - used.vcpus, spec.memory_gib - used.memory_gib]

    def choose(self, job: Any, now: datetime) -> tuple[PlacementOption, str] | None:
        """The warm option for ``job`` and its note, with the room booked for this cycle; ``None`` when no
        pool of its namespace/queue has an instance with room whose offer passes the job's filters."""
        if not self._pools:
            return None
        request = job.request
        if request.nodes > 1 or request.gpus > 0 or request.data:
            return None  # gangs, GPUs and data inputs are placed as usual
        from policies.placement.engine import check_offer, price_offer

        egress = self.state.egress_model()
        for spec, ids in self._pools:
            if spec.namespace != job.namespace or (spec.queue and spec.queue != (job.spec.queue or "")):
                continue
            if request.providers and spec.provider not in request.providers:
                continue
            offer = spec.offer()
            if not check_offer(request, offer, egress, now=now).passed:
                continue
            fits = [(f[0] - request.vcpus, vm) for vm in ids if vm not in self.cordoned
                    for f in [self._free.get(vm)] if f is not None
                    and f[0] + 1e-9 >= request.vcpus and f[1] + 1e-6 >= request.memory_gib]
            if not fits:
                continue
            _, vm = min(fits)  # best fit: the fullest instance that still holds it
            self._free[vm][0] -= request.vcpus
            self._free[vm][1] -= request.memory_gib
            option = price_offer(request, offer, egress)
            note = (f"warm pool {spec.name}: instance {vm} ({spec.instance_type}, already paid by the pool at "
                    f"${spec.hourly_usd:.4f}/h) has room; no new instance provisioned")
            self._bound[job.id] = (option, {POOL_KEY: spec.name, POOL_INSTANCE_KEY: vm})
            return option, note
        return None

    def binding(self, job_id: str, option: PlacementOption | None = None) -> dict[str, str] | None:
        """The pool binding of ``job_id`` chosen this cycle (only when ``option`` is its warm option)."""
        hit = self._bound.get(job_id)
        if hit is None or (option is not None and option is not hit[0]):
            return None
        return hit[1]

    def launch(self, job: Any, request_id: str, tags: dict[str, str]) -> Any:
        """Start ``job`` on its bound instance (``run_on``); a :class:`providers.failover.ProvisionOutcome`."""
        from broker.errors import ProviderError
        from broker.model import Attempt
        from providers.failover import ProvisionOutcome

        option, bind = self._bound[job.id]
        vm = bind[POOL_INSTANCE_KEY]
        provider = self.state.get_provider(option.provider)
        now = self.state.clock.now()
        try:
            run = provider.run_on(vm, request_id, tags=tags, job=job.spec)
        except Exception as exc:  # noqa: BLE001 - the job's other options are tried next
            err = exc if isinstance(exc, ProviderError) else ProviderError(
                f"{option.provider}: run on {vm} failed: {type(exc).__name__}: {exc}", provider=option.provider,
                request_id=request_id)
            attempt = Attempt(provider=option.provider, region=option.region, instance_type=option.instance_type,
                              capacity=option.capacity, outcome=err.kind, at=now, retryable=True,
                              message=f"warm pool {bind[POOL_KEY]} instance {vm}: {err}")
            return ProvisionOutcome(instances=[], option=None, attempts=[attempt], error=err)
        attempt = Attempt(provider=option.provider, region=option.region, instance_type=option.instance_type,
                          capacity=option.capacity, outcome="launched", at=now,
                          message=f"on warm pool {bind[POOL_KEY]} instance {vm}: run {run.id}")
        return ProvisionOutcome(instances=[run], option=option, attempts=[attempt], error=None)


class Consolidator:
    """Carries out consolidation plans for the pools that enable it (see the module docstring)."""

    def __init__(self, state: Any, warm: WarmPools) -> None:
        self.state = state
        self.warm = warm
        self._last: dict[str, datetime] = {}  # pool -> when its last consolidation round acted

    def __call__(self, now: datetime) -> list[dict[str, Any]]:
        from policies.consolidate import Node, Pod, plan_consolidation

        with self.state.store.read() as session:
            pools = [(s, ids, row) for s, ids, row in _stored_pools(session)
                     if s.consolidation and _warm_capable(self.state, s.provider)]
            load = pool_load(session, sorted({s.provider for s, _, _ in pools})) if pools else {}
        done: list[dict[str, Any]] = []
        for spec, ids, row in pools:
            last = self._last.get(spec.name)
            if last is not None and (now - last).total_seconds() < spec.consolidation_cooldown_seconds:
                continue
            nodes = []
            for vm in ids:
                used = load.get(vm, VmLoad())
                pods = tuple(Pod(job_id, float(r.vcpus), float(r.memory_gib),
                                 do_not_disrupt=state != JobState.RUNNING.value or not _checkpoints(r.spec_json))
                             for job_id, state, r in used.jobs)
                nodes.append(Node(vm, spec.vcpus, spec.memory_gib, spec.hourly_usd, pods))
            kept = list(ids)
            work = sum(n.used_vcpus for n in nodes)
            acted: list[dict[str, Any]] = []
            for action in plan_consolidation(nodes):
                if action.kind != "delete" or len(acted) >= spec.consolidation_budget:
                    continue
                if len(kept) - 1 < spec.policy.min_replicas:
                    break
                left = (len(kept) - 1) * spec.vcpus
                if left <= 0 or work / left > spec.policy.scale_out_utilization + 1e-9:
                    continue  # the autoscaler would scale right out again
                acted.append(self._release(spec, action, load.get(action.node, VmLoad()), now))
                if acted[-1]["released"]:
                    kept.remove(action.node)
            if acted:
                self._last[spec.name] = now
                self._store(spec, row, kept, acted, now)
                done.extend(acted)
        return done

    def _release(self, spec: PoolSpec, action: Any, load: VmLoad, now: datetime) -> dict[str, Any]:
        vm = action.node
        self.warm.cordoned.add(vm)  # the moved jobs pack onto the instances that stay
        dest = ", ".join(sorted({d for _, d in action.moves}))
        reason = (f"consolidation of warm pool {spec.name}: instance {vm} under-used, its work fits on {dest}; "
                  "old run fenced, re-placed from its last checkpoint")
        victims = [(r, reason, {"consolidation": spec.name, "instance": vm, "fenced_request_id": r.request_id})
                   for _, _, r in load.jobs]
        moved = self.state.ops.health.requeue(victims, now, "consolidation") if victims else []
        try:
            self.state.get_provider(spec.provider).terminate([vm], f"pool-{spec.name}-consolidation")
        except Exception as exc:  # noqa: BLE001 - it stays in the pool, cordoned, empty: the next round retries
            log.warning("pool %s: terminating %s after consolidation failed: %s", spec.name, vm, exc)
            return {"pool": spec.name, "instance": vm, "moved": moved, "to": dest, "released": False,
                    "reason": f"consolidation: moved {len(moved)} job(s) off {vm}; terminating it failed: {exc}",
                    "saving_usd_per_hour": 0.0}
        self.warm.cordoned.discard(vm)
        self.state.metrics.consolidations.labels(spec.name).inc()
        text = (f"consolidation: released {vm} (${action.saving_usd_per_hour:.4f}/h saved); moved "
                f"{len(moved)} job(s) to {dest or 'nothing'}")
        log.info("pool %s: %s", spec.name, text)
        return {"pool": spec.name, "instance": vm, "moved": moved, "to": dest, "released": True, "reason": text,
                "saving_usd_per_hour": action.saving_usd_per_hour}

    def _store(self, spec: PoolSpec, row: Any, kept: list[str], acted: list[dict[str, Any]], now: datetime) -> None:
        with self.state.store.tx() as session:
            current = session.execute(sa.select(_pools.c.instances_json, _pools.c.recommendations_json)
                                      .where(_pools.c.name == spec.name)).first()
            if current is None:
                return
            released = {a["instance"] for a in acted if a["released"]}
            instances = [i for i in json.loads(current.instances_json or "[]") if i not in released]
            decisions = json.loads(current.recommendations_json or "[]")
            n = len(instances) + len(released)
            for a in acted:
                decisions.append({"at": now.isoformat(), "from": n, "to": n - a["released"], "reason": a["reason"]})
                n -= a["released"]
            session.execute(sa.update(_pools).where(_pools.c.name == spec.name).values(
                instances_json=json.dumps(instances), desired=len(instances), last_scale_at=now,
                recommendations_json=json.dumps(decisions[-20:]), updated_at=now))
