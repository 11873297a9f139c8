"""VPA-style recommendations from measured usage, and the planning recommendations of ``broker
recommendations`` (idle pools, over-requested resources, spot candidates).

Measured usage is kept as samples (``job_memory_used_gib``, ``job_cpu_used``; labels ``namespace``,
``job`` = the job's name, which is what makes a job *recurring*): the on-prem pool's kernel accounting of
every ended run (:func:`collect_onprem_usage`: peak RSS and CPU seconds over the run time), or pushed by
agents through ``POST /v1/ops/samples``.

A recommendation is the highest measured value (``peak``) of the last runs plus ``margin`` (default 15 %),
rounded up (memory to 0.25 GiB, CPU to 0.1 vCPU), when that is below the request: "asks 32 GiB, used at
most 9.1 GiB". :func:`apply_to_spec` lowers a later run's request to it (never raises it).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import sqlalchemy as sa

from broker.model import JobState
from broker.ops.samples import Sample, read_series, record
from broker.store import JobRow, utc

__all__ = ["Recommendation", "collect_onprem_usage", "vpa_recommendations", "apply_to_spec", "autosize_doc",
           "autosize_text", "measured_usage", "planning_report", "ORIGINAL_REQUESTS"]

_jobs = JobRow.__table__  # type: ignore[attr-defined]
MEMORY, CPU = "job_memory_used_gib", "job_cpu_used"


@dataclass(frozen=True)
class Recommendation:
    kind: str  # memory | cpu | idle-pool | spot
    namespace: str
    target: str  # a job name or a pool name
    requested: float
    used_max: float
    recommended: float
    runs: int
    message: str


def _gib(x: float) -> str:
    return f"{x:.3g} GiB" if x < 10 else f"{x:.1f} GiB"


def collect_onprem_usage(state: Any, since: datetime, now: datetime, seen: set[str] | None = None) -> int:
    """Record the measured peak memory and mean CPU of on-prem runs that ended from ``since`` to ``now``
    (both included); jobs in ``seen`` are skipped and the recorded ones added to it."""
    pool = state.providers.get("onprem")
    if pool is None or not hasattr(pool, "usage"):
        return 0
    with state.store.read() as session:
        rows = list(session.execute(sa.select(_jobs.c.id, _jobs.c.namespace, _jobs.c.name, _jobs.c.instances_json,
                                              _jobs.c.started_at, _jobs.c.finished_at).where(
            _jobs.c.provider == "onprem", _jobs.c.state.in_((JobState.SUCCEEDED.value, JobState.FAILED.value)),
            _jobs.c.finished_at >= since, _jobs.c.finished_at <= now)))
    samples: list[Sample] = []
    for r in rows:
        if seen is not None:
            if r.id in seen:
                continue
            seen.add(r.id)
        try:
            ids = [i["id"] if isinstance(i, dict) else str(i) for i in json.loads(r.instances_json or "[]")]
        except ValueError:
            continue
        for iid in ids:
            try:
                use = pool.usage(iid)
            except Exception:  # noqa: BLE001 - a run the pool no longer knows
                use = None
            if not use:
                continue
            labels = {"namespace": r.namespace, "job": r.name}
            at = utc(r.finished_at)
            samples.append(Sample(MEMORY, labels, use["max_rss_mib"] / 1024.0, at))
            if r.started_at is not None:
                secs = max(1e-3, (at - utc(r.started_at)).total_seconds())
                samples.append(Sample(CPU, labels, use["cpu_seconds"] / secs, at))
    if samples:
        with state.store.tx() as session:
            record(session, samples)
    return len(samples)


def _requests(session: Any, namespace: str, name: str) -> tuple[float, float] | None:
    row = session.execute(sa.select(_jobs.c.vcpus, _jobs.c.memory_gib, _jobs.c.spec_json).where(
        _jobs.c.namespace == namespace, _jobs.c.name == name).order_by(_jobs.c.created_at.desc()).limit(1)).first()
    if row is None:
        return None
    try:
        nodes = int(json.loads(row.spec_json).get("spec", {}).get("nodes", 1) or 1)
    except (ValueError, AttributeError):
        nodes = 1
    return float(row.vcpus) / nodes, float(row.memory_gib) / nodes


def vpa_recommendations(session: Any, now: datetime, *, window_days: float = 30.0, margin: float = 0.15,
                        min_runs: int = 3, namespace: str | None = None) -> list[Recommendation]:
    """Memory and CPU recommendations per recurring job (at least ``min_runs`` measured runs)."""
    since = now - timedelta(days=window_days)
    out: list[Recommendation] = []
    for metric, kind in ((MEMORY, "memory"), (CPU, "cpu")):
        for s in read_series(session, metric, selector={"namespace": namespace} if namespace else None,
                             since=since, until=now):
            ns, name = s.labels.get("namespace", ""), s.labels.get("job", "")
            if len(s) < min_runs or not ns or not name:
                continue
            req = _requests(session, ns, name)
            if req is None:
                continue
            asked = req[1] if kind == "memory" else req[0]
            rec = _recommend(kind, ns, name, asked, s.values, margin)
            if rec is not None:
                out.append(rec)
    return sorted(out, key=lambda r: (r.namespace, r.target, r.kind))


def _recommend(kind: str, namespace: str, name: str, asked: float, used: Any, margin: float,
               floor: float = 0.0) -> Recommendation | None:
    """The recommendation for ``kind`` (memory or cpu) from the measured values ``used``: their peak plus
    ``margin``, rounded up (memory to 0.25 GiB, CPU to 0.1 vCPU), at least ``floor``; ``None`` when that is
    not below ``asked`` (a recommendation never raises a request)."""
    peak = float(np.max(used))
    step = 0.25 if kind == "memory" else 0.1
    rec = max(round(math.ceil(peak * (1 + margin) / step - 1e-9) * step, 4), floor)
    if asked <= 0 or rec >= asked - 1e-9:
        return None
    if kind == "memory":
        msg = f"{name}: asks {_gib(asked)}, used at most {_gib(peak)} over {len(used)} runs; request {_gib(rec)}"
    else:
        msg = f"{name}: asks {asked:g} vCPU, used at most {peak:.2f} over {len(used)} runs; request {rec:.1f} vCPU"
    return Recommendation(kind, namespace, name, asked, peak, rec, len(used), msg)


ORIGINAL_REQUESTS = "vpa.hybrid-broker.io/original-requests"


def measured_usage(session: Any, namespace: str, name: str, now: datetime, *,
                   window_days: float = 30.0) -> dict[str, list[float]]:
    """The measured values of job ``name`` of ``namespace`` in the last ``window_days``, by kind (``cpu``,
    ``memory``), one per measured run."""
    since = now - timedelta(days=window_days)
    return {kind: [float(v) for series in read_series(session, metric, selector={"namespace": namespace, "job": name},
                                                      since=since, until=now) for v in series.values]
            for metric, kind in ((CPU, "cpu"), (MEMORY, "memory"))}


def autosize_doc(session: Any, doc: Mapping[str, Any], namespace: str, now: datetime, *,
                 margin: float = 0.15, min_runs: int = 3,
                 usage: dict[tuple[str, str], dict[str, list[float]]] | None = None,
                 ) -> tuple[dict[str, Any], list[Recommendation]] | None:
    """``spec.verticalScaling.updateMode: Initial``: a copy of job document ``doc`` with its per-node cpu and
    memory requests lowered (:func:`apply_to_spec`) to the recommendations from the measured runs of the same
    job (:func:`measured_usage`, at least ``min_runs``), never below ``minAllowed``, and those
    recommendations. The first request is kept in the annotation :data:`ORIGINAL_REQUESTS`. ``None`` when
    nothing changes (mode Off, too few runs, or the request is already at or below the recommendation).
    ``usage`` caches :func:`measured_usage` by (namespace, name) across calls (a burst of one job)."""
    from broker.spec import parse_cpu, parse_memory_gib

    spec = doc.get("spec") or {}
    vs = spec.get("verticalScaling") or {}
    name = (doc.get("metadata") or {}).get("name")
    if vs.get("updateMode", "Off") != "Initial" or not name:
        return None
    resources = spec.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    floor = vs.get("minAllowed") or {}
    asked = {"cpu": parse_cpu(requests.get("cpu", limits.get("cpu", 1)), "cpu"),
             "memory": parse_memory_gib(requests.get("memory", limits.get("memory", "2Gi")), "memory")}
    lowest = {"cpu": parse_cpu(floor["cpu"], "cpu") if "cpu" in floor else 0.0,
              "memory": parse_memory_gib(floor["memory"], "memory") if "memory" in floor else 0.0}
    usage = {} if usage is None else usage
    if (namespace, name) not in usage:
        usage[(namespace, name)] = measured_usage(session, namespace, name, now)
    recs = [r for kind, values in usage[(namespace, name)].items() if len(values) >= min_runs
            if (r := _recommend(kind, namespace, name, asked[kind], values, margin, lowest[kind])) is not None]
    if not recs:
        return None
    out = apply_to_spec(doc, recs)
    out.setdefault("metadata", {}).setdefault("annotations", {}).setdefault(
        ORIGINAL_REQUESTS, f"cpu={asked['cpu']:g},memory={asked['memory']:g}Gi")
    return out, recs


def autosize_text(recs: list[Recommendation]) -> str:
    """One line for the job's event: "memory 32 GiB -> 10.5 GiB (used at most 9.1 GiB over 3 runs); ..."."""
    parts = []
    for r in recs:
        if r.kind == "memory":
            parts.append(f"memory {_gib(r.requested)} -> {_gib(r.recommended)} (used at most "
                         f"{_gib(r.used_max)} over {r.runs} runs)")
        else:
            parts.append(f"cpu {r.requested:g} -> {r.recommended:g} vCPU (used at most {r.used_max:.2f} "
                         f"over {r.runs} runs)")
    return "requests lowered by verticalScaling (updateMode Initial): " + "; ".join(parts)


def apply_to_spec(doc: Mapping[str, Any], recs: list[Recommendation]) -> dict[str, Any]:
    """A copy of job document ``doc`` with its requests lowered to the recommendations for its name (memory
    as ``<GiB>Gi``, cpu as vCPUs)."""
    out = json.loads(json.dumps(doc))
    name = out.get("metadata", {}).get("name")
    req = out.setdefault("spec", {}).setdefault("resources", {}).setdefault("requests", {})
    for r in recs:
        if r.target != name:
            continue
        if r.kind == "memory":
            req["memory"] = f"{r.recommended:g}Gi"
        elif r.kind == "cpu":
            req["cpu"] = f"{r.recommended:g}"
    return out


def planning_report(session: Any, now: datetime, *, window_days: float = 7.0) -> list[Recommendation]:
    """VPA recommendations plus idle pools (mean CPU utilization under 10 % above their minimum) and spot
    candidates (recurring jobs that ran on demand and checkpoint, or are short, so a reclaim costs little)."""
    from broker.ops.autoscale import list_pools

    out = vpa_recommendations(session, now, window_days=max(window_days, 30.0))
    since = now - timedelta(days=window_days)
    util = {s.labels.get("pool"): s for s in read_series(session, "utilization", selector={"scope": "pool"},
                                                         since=since, until=now)}
    for p in list_pools(session):
        s = util.get(p["name"])
        idle = s is not None and len(s) >= 10 and float(np.mean(s.values)) < 0.10
        if s is not None and idle and len(p["instances"]) > p["min_replicas"]:
            out.append(Recommendation("idle-pool", p["namespace"], p["name"], float(len(p["instances"])),
                                      float(np.mean(s.values)), float(p["min_replicas"]), len(s),
                                      f"pool {p['name']} is idle: mean utilization {np.mean(s.values):.0%} "
                                      f"over {window_days:g} days; lower minReplicas"))
    runs: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in session.execute(sa.select(_jobs.c.namespace, _jobs.c.name, _jobs.c.placement_json, _jobs.c.spec_json,
                                       _jobs.c.started_at, _jobs.c.finished_at).where(
            _jobs.c.state == JobState.SUCCEEDED.value, _jobs.c.finished_at >= since,
            _jobs.c.provider.not_in(("onprem", "edge")))):
        runs[(r.namespace, r.name)].append(r)
    for (ns, name), rs in sorted(runs.items()):
        on_demand = [r for r in rs if json.loads(r.placement_json or "{}").get("capacity") == "on-demand"]
        if len(on_demand) < 2:
            continue
        spec = json.loads(rs[-1].spec_json).get("spec", {})
        hours = [(utc(r.finished_at) - utc(r.started_at)).total_seconds() / 3600 for r in on_demand if r.started_at]
        short = bool(hours) and max(hours) <= 2.0
        if spec.get("checkpoint") or short:
            why = "it checkpoints" if spec.get("checkpoint") else f"its runs take at most {max(hours):.1f} h"
            usd = sum(float(json.loads(r.placement_json or "{}").get("total_usd", 0.0)) for r in on_demand)
            out.append(Recommendation("spot", ns, name, usd, 0.0, 0.0, len(on_demand),
                                      f"{name}: {len(on_demand)} on-demand runs (${usd:.2f}) and {why}; "
                                      "allow spot (placement.spot: allowed)"))
    return out
