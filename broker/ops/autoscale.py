"""Broker-owned elastic pools: groups of cloud instances kept warm for a namespace (or one queue of it),
scaled by :func:`policies.autoscale.decide` from their utilization, the queue's length and wait, and
optionally a Holt-Winters forecast of arrivals (:mod:`broker.ops.forecast`) that provisions ahead of the
peak.

A pool document (``PUT /v1/ops/pools/{name}``, validated by :func:`parse_pool`)::

    kind: Pool
    metadata: {name: batch-warm}
    spec:
      namespace: team-a            # whose work it is kept warm for (queue: optional)
      provider: aws
      region: us-east-1
      instanceType: {name: m7i.2xlarge, vcpus: 8, memoryGiB: 32, hourlyUSD: 0.4032}
      minReplicas: 1
      maxReplicas: 20
      scaleOutUtilization: 0.7     # the HPA band and target (default midpoint)
      scaleInUtilization: 0.3
      stabilizationWindowSeconds: 300
      cooldownSeconds: 60
      queueLengthPerReplica: 4     # custom metric (optional)
      queueWaitSeconds: 600        # custom metric (optional)
      predictive: {enabled: true, serviceSeconds: 1800, targetUtilization: 0.7, leadSeconds: 900}
      consolidation: {enabled: true, maxDisrupted: 1, cooldownSeconds: 300}   # optional (broker.ops.warm)

Utilization is the vCPU that the namespace's RUNNING jobs on the pool's provider and region request,
over the pool's vCPU (an instance still booting counts as idle, as HPA counts unready pods). Each
reconcile launches or terminates instances (request ids ``pool-<name>-<n>``, tag ``hb-pool``) to the
decided count and stores the decision. Scale-in terminates the newest *idle* instances first: an instance
with work bound to it (:func:`broker.ops.warm.pool_load`) is never removed, so the pool stays larger than
decided until work ends (or consolidation moves it). Jobs of the pool's namespace/queue run on its
instances (:mod:`broker.ops.warm`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from broker.errors import SpecError
from broker.model import Capacity, InstanceType, JobState, Location, Offer
from broker.ops.forecast import ArrivalForecaster, replicas_for_rate
from broker.ops.samples import Sample
from broker.ops.store import PoolRow
from broker.store import JobRow, utc
from policies.autoscale import MetricValue, ScalePolicy, decide
from providers.base import TAG_POOL

__all__ = ["PoolSpec", "parse_pool", "PoolAutoscaler", "put_pool", "list_pools", "TAG_POOL"]

log = logging.getLogger("broker.ops.autoscale")
_pools = PoolRow.__table__  # type: ignore[attr-defined]
_jobs = JobRow.__table__  # type: ignore[attr-defined]
_SPEC_KEYS = {"namespace", "queue", "provider", "region", "instanceType", "minReplicas", "maxReplicas",
              "scaleOutUtilization", "scaleInUtilization", "targetUtilization", "stabilizationWindowSeconds",
              "cooldownSeconds", "queueLengthPerReplica", "queueWaitSeconds", "predictive", "consolidation"}
_CONSOLIDATION_KEYS = {"enabled", "maxDisrupted", "cooldownSeconds"}


@dataclass(frozen=True)
class PoolSpec:
    name: str
    namespace: str
    provider: str
    region: str
    instance_type: str
    vcpus: float
    memory_gib: float
    hourly_usd: float
    policy: ScalePolicy
    queue: str = ""
    queue_per_replica: float | None = None
    queue_wait_seconds: float | None = None
    predictive: bool = False
    service_seconds: float = 1800.0
    forecast_target_utilization: float = 0.7
    lead_seconds: float = 900.0
    consolidation: bool = False
    consolidation_budget: int = 1
    consolidation_cooldown_seconds: float = 300.0

    def offer(self) -> Offer:
        return Offer(InstanceType(self.instance_type, self.vcpus, self.memory_gib),
                     Location(self.provider, self.region), Capacity.ON_DEMAND, self.hourly_usd, source="pool")


def _num(d: Mapping[str, Any], key: str, where: str, default: float | None, lo: float, hi: float) -> float | None:
    v = d.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise SpecError(f"{where}.{key}", f"expected a number in [{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def _str(d: Mapping[str, Any], key: str, where: str, required: bool = True) -> str:
    v = d.get(key, "" if not required else None)
    if not isinstance(v, str) or (required and not v) or len(v) > 128:
        raise SpecError(f"{where}.{key}",
                        "required: a string of 1..128 characters" if required else "expected a string")
    return v


def parse_pool(doc: Any, name: str) -> PoolSpec:
    """A pool document -> :class:`PoolSpec`; any mistake is a SpecError naming the field."""
    if not isinstance(doc, Mapping):
        raise SpecError("", "expected a Pool document (a mapping with spec)")
    if doc.get("kind", "Pool") != "Pool":
        raise SpecError("kind", "expected Pool")
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError("spec", "required: a mapping")
    unknown = sorted(set(map(str, spec)) - _SPEC_KEYS)
    if unknown:
        raise SpecError(f"spec.{unknown[0]}", f"unknown field. To fix: use one of {', '.join(sorted(_SPEC_KEYS))}")
    it = spec.get("instanceType")
    if not isinstance(it, Mapping):
        raise SpecError("spec.instanceType", "required: {name, vcpus, memoryGiB, hourlyUSD}")
    lo = int(_num(spec, "minReplicas", "spec", 0, 0, 10_000) or 0)
    hi = int(_num(spec, "maxReplicas", "spec", 10, 1, 10_000) or 1)
    if lo > hi:
        raise SpecError("spec.minReplicas", f"{lo} is above maxReplicas {hi}")
    out_u = _num(spec, "scaleOutUtilization", "spec", 0.7, 0.01, 1.0) or 0.7
    in_u = _num(spec, "scaleInUtilization", "spec", 0.3, 0.0, 0.99) or 0.3
    if in_u >= out_u:
        raise SpecError("spec.scaleInUtilization", f"{in_u} must be below scaleOutUtilization {out_u}")
    target = _num(spec, "targetUtilization", "spec", None, in_u, out_u)
    pred = spec.get("predictive") or {}
    if not isinstance(pred, Mapping):
        raise SpecError("spec.predictive", "expected a mapping")
    cons = spec.get("consolidation") or {}
    if not isinstance(cons, Mapping):
        raise SpecError("spec.consolidation", "expected a mapping")
    bad = sorted(set(map(str, cons)) - _CONSOLIDATION_KEYS)
    if bad:
        raise SpecError(f"spec.consolidation.{bad[0]}",
                        f"unknown field. To fix: use one of {', '.join(sorted(_CONSOLIDATION_KEYS))}")
    if not isinstance(cons.get("enabled", False), bool):
        raise SpecError("spec.consolidation.enabled", "expected true or false")
    policy = ScalePolicy(min_replicas=lo, max_replicas=hi, scale_out_utilization=out_u, scale_in_utilization=in_u,
                         target_utilization=target,
                         scale_down_stabilization_seconds=_num(spec, "stabilizationWindowSeconds", "spec", 300, 0,
                                                               86400) or 0.0,
                         cooldown_seconds=_num(spec, "cooldownSeconds", "spec", 60, 0, 86400) or 0.0)
    return PoolSpec(
        name=name, namespace=_str(spec, "namespace", "spec"), queue=_str(spec, "queue", "spec", required=False),
        provider=_str(spec, "provider", "spec"), region=_str(spec, "region", "spec"),
        instance_type=_str(it, "name", "spec.instanceType"),
        vcpus=_num(it, "vcpus", "spec.instanceType", None, 0.25, 4096) or 0.0,
        memory_gib=_num(it, "memoryGiB", "spec.instanceType", 0, 0, 1 << 20) or 0.0,
        hourly_usd=_num(it, "hourlyUSD", "spec.instanceType", 0, 0, 10_000) or 0.0,
        policy=policy,
        queue_per_replica=_num(spec, "queueLengthPerReplica", "spec", None, 0.01, 1e6),
        queue_wait_seconds=_num(spec, "queueWaitSeconds", "spec", None, 1, 86400 * 7),
        predictive=bool(pred.get("enabled", False)),
        service_seconds=_num(pred, "serviceSeconds", "spec.predictive", 1800, 1, 86400 * 7) or 1800.0,
        forecast_target_utilization=_num(pred, "targetUtilization", "spec.predictive", 0.7, 0.05, 1.0) or 0.7,
        lead_seconds=_num(pred, "leadSeconds", "spec.predictive", 900, 0, 86400) or 0.0,
        consolidation=bool(cons.get("enabled", False)),
        consolidation_budget=int(_num(cons, "maxDisrupted", "spec.consolidation", 1, 1, 1000) or 1),
        consolidation_cooldown_seconds=_num(cons, "cooldownSeconds", "spec.consolidation", 300, 0, 86400) or 0.0,
    )


def put_pool(session: Any, name: str, doc: Mapping[str, Any], now: datetime) -> PoolSpec:
    """Validate and store a pool (its instances and desired count are kept when it exists)."""
    spec = parse_pool(doc, name)
    values = {"namespace": spec.namespace, "queue": spec.queue, "provider": spec.provider, "region": spec.region,
              "instance_type": spec.instance_type, "hourly_usd": spec.hourly_usd,
              "min_replicas": spec.policy.min_replicas, "max_replicas": spec.policy.max_replicas,
              "policy_json": json.dumps(doc), "updated_at": now}
    if session.execute(sa.select(_pools.c.name).where(_pools.c.name == name)).first():
        session.execute(sa.update(_pools).where(_pools.c.name == name).values(**values))
    else:
        session.execute(sa.insert(_pools).values(name=name, desired=0, instances_json="[]",
                                                 recommendations_json="[]", **values))
    return spec


def list_pools(session: Any) -> list[dict[str, Any]]:
    out = []
    for r in session.execute(sa.select(_pools).order_by(_pools.c.name)):
        decisions = json.loads(r.recommendations_json or "[]")
        out.append({"name": r.name, "namespace": r.namespace, "queue": r.queue, "provider": r.provider,
                    "region": r.region, "instance_type": r.instance_type, "hourly_usd": r.hourly_usd,
                    "min_replicas": r.min_replicas, "max_replicas": r.max_replicas, "desired": r.desired,
                    "instances": json.loads(r.instances_json or "[]"),
                    "last_scale_at": utc(r.last_scale_at).isoformat() if r.last_scale_at else None,
                    "last_decision": decisions[-1]["reason"] if decisions else ""})
    return out


class PoolAutoscaler:
    """Reconciles every stored pool to its decided size (see the module docstring)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self._history: dict[str, tuple[tuple[float, int], ...]] = {}
        self._forecasters: dict[str, ArrivalForecaster] = {}
        self._seen_until: dict[str, datetime] = {}
        self._seq: dict[str, int] = {}

    def _metrics(self, session: Any, spec: PoolSpec, n: int, now: datetime) -> list[MetricValue]:
        ns = _jobs.c.namespace == spec.namespace
        running = session.execute(sa.select(sa.func.coalesce(sa.func.sum(_jobs.c.vcpus), 0.0)).where(
            ns, _jobs.c.state == JobState.RUNNING.value, _jobs.c.provider == spec.provider,
            _jobs.c.region == spec.region)).scalar() or 0.0
        pending = session.execute(sa.select(sa.func.count(), sa.func.min(_jobs.c.created_at)).where(
            ns, _jobs.c.state == JobState.PENDING.value)).one()
        out = []
        if n > 0:
            out.append(MetricValue("cpu", "utilization", min(1.0, float(running) / (n * spec.vcpus))))
        if spec.queue_per_replica is not None:
            out.append(MetricValue("queue_length", "average", float(pending[0]), spec.queue_per_replica))
        if spec.queue_wait_seconds is not None and pending[1] is not None:
            wait = max(0.0, (now - utc(pending[1])).total_seconds())
            out.append(MetricValue("queue_wait", "value", wait, spec.queue_wait_seconds))
        return out

    def _floor(self, session: Any, spec: PoolSpec, now: datetime) -> int:
        if not spec.predictive:
            return 0
        fc = self._forecasters.setdefault(spec.name, ArrivalForecaster())
        since = self._seen_until.get(spec.name)
        stmt = sa.select(_jobs.c.created_at).where(_jobs.c.namespace == spec.namespace, _jobs.c.created_at <= now)
        if since is not None:
            stmt = stmt.where(_jobs.c.created_at > since)
        for (at,) in session.execute(stmt):
            fc.observe(utc(at).timestamp())
        self._seen_until[spec.name] = now
        t = now.timestamp()
        rates = [r for r in (fc.rate(t + 300, t), fc.rate(t + 300 + spec.lead_seconds, t)) if r is not None]
        if not rates:
            return 0
        slots = max(1, int(spec.vcpus))  # one slot per vCPU: the service time counts in vCPU-seconds per job
        return replicas_for_rate(max(rates), spec.service_seconds, slots, spec.forecast_target_utilization)

    def reconcile(self, now: datetime | None = None) -> list[dict[str, Any]]:
        """One decision per pool, applied; returns the decisions."""
        now = now or self.state.clock.now()
        out: list[dict[str, Any]] = []
        with self.state.store.read() as session:
            rows = list(session.execute(sa.select(_pools)))
        for row in rows:
            try:
                spec = parse_pool(json.loads(row.policy_json), row.name)
            except (SpecError, ValueError) as exc:  # validated when stored; a bad row must not stop the others
                log.error("pool %s: stored spec invalid: %s", row.name, exc)
                continue
            instances: list[str] = json.loads(row.instances_json or "[]")
            with self.state.store.read() as session:
                metrics = self._metrics(session, spec, len(instances), now)
                floor = self._floor(session, spec, now)
            last = utc(row.last_scale_at).timestamp() if row.last_scale_at else None
            d = decide(len(instances), metrics, spec.policy, now_seconds=now.timestamp(),
                       history=self._history.get(row.name, ()), last_scale_seconds=last, floor=floor)
            self._history[row.name] = d.history
            changed = self._apply(spec, instances, d.desired)
            decisions = json.loads(row.recommendations_json or "[]")[-19:]
            entry = {"at": now.isoformat(), "from": len(changed[1]), "to": len(changed[0]), "reason": d.reason}
            decisions.append(entry)
            with self.state.store.tx() as session:
                values: dict[str, Any] = {"desired": d.desired, "instances_json": json.dumps(changed[0]),
                                          "recommendations_json": json.dumps(decisions), "updated_at": now}
                if len(changed[0]) != len(instances):
                    values["last_scale_at"] = now
                session.execute(sa.update(_pools).where(_pools.c.name == row.name).values(**values))
            self.state.metrics.pool_replicas.labels(row.name, "desired").set(d.desired)
            self.state.metrics.pool_replicas.labels(row.name, "current").set(len(changed[0]))
            out.append({"pool": row.name, **entry})
        return out

    def _apply(self, spec: PoolSpec, instances: list[str], desired: int) -> tuple[list[str], list[str]]:
        provider = self.state.providers.get(spec.provider)
        if provider is None or desired == len(instances):
            return instances, instances
        now_ids = list(instances)
        if desired > len(instances):
            n = self._seq.get(spec.name, len(instances))
            self._seq[spec.name] = n + 1
            try:
                made = provider.launch(spec.offer(), desired - len(instances), f"pool-{spec.name}-{n}",
                                       tags={TAG_POOL: spec.name})
                now_ids += [i.id for i in made]
            except Exception as exc:  # noqa: BLE001 - retried at the next reconcile
                log.warning("pool %s: launching %d failed: %s", spec.name, desired - len(instances), exc)
        else:
            from broker.ops.warm import pool_load

            with self.state.store.read() as session:
                busy = set(pool_load(session, [spec.provider]))
            idle = [i for i in reversed(now_ids) if i not in busy]  # newest first; work is never removed
            drop = idle[:len(now_ids) - desired]
            if len(drop) < len(now_ids) - desired:
                log.info("pool %s: scale-in to %d keeps %d instance(s) that run work", spec.name, desired,
                         len(now_ids) - desired - len(drop))
            if drop:
                try:
                    provider.terminate(drop, f"pool-{spec.name}-scale-in")
                    now_ids = [i for i in now_ids if i not in drop]
                except Exception as exc:  # noqa: BLE001
                    log.warning("pool %s: terminating %s failed: %s", spec.name, drop, exc)
        return now_ids, instances

    def samples(self, now: datetime) -> list[Sample]:
        """Pool sizes and utilization for the metric history (a source of :class:`broker.ops.collect.Collector`)."""
        out = []
        with self.state.store.read() as session:
            for p in list_pools(session):
                n = len(p["instances"])
                labels = {"pool": p["name"], "provider": p["provider"], "region": p["region"]}
                out.append(Sample("pool_replicas", {**labels, "kind": "current"}, float(n), now))
                out.append(Sample("pool_replicas", {**labels, "kind": "desired"}, float(p["desired"]), now))
        return out


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)
