"""On-prem pools for Python-native work on a real Ray cluster, through Ray's job submission API.

(The module is ``ray_engine``, not ``ray``, so it never shadows the ``ray`` package.)

Each broker run is one Ray job (``ray.job_submission.JobSubmissionClient`` against the cluster's dashboard
address, ``BROKER_RAY_ADDRESS``): its entrypoint is the job's command, its runtime env carries the job's
``env`` plus ``HB_JOB``, ``HB_INSTANCE_ID`` and ``HB_NODE``, and its entrypoint resources are the job's
request (``entrypoint_num_cpus``/``_gpus``/``_memory``), so Ray itself queues it until a node has room.

* **Offers**: one offer for the cluster (instance type ``BROKER_RAY_POOL``, default ``ray``) shaped like its
  largest alive node (CPUs, ``memory``, GPUs from the state API's ``list_nodes``), site ``BROKER_RAY_SITE``,
  capacity ``owned`` at ``BROKER_RAY_NODE_USD_PER_HOUR``. :meth:`RayPool.free` sums the alive nodes.
* **Idempotent per request id** on the cluster's side: the submission id is ``hb-<hash of request id>-<n>``,
  and Ray refuses a second job with an id it knows. A relaunch finds the job by that id (``get_job_info``)
  and submits nothing, whichever broker process asks.
* **Tags** are the job's ``metadata`` (``hb-job``, ``hb-request``, ``hb-node``, ...); :meth:`RayPool.instances`
  lists the cluster's jobs whose metadata carries ``hb-request``.
* **States**: ``PENDING`` -> pending, ``RUNNING`` -> running, ``SUCCEEDED`` -> succeeded (exit code 0),
  ``FAILED`` -> failed with ``driver_exit_code`` (``None`` when the entrypoint never ran: runtime env setup,
  a lost node; then also reported once by :meth:`RayPool.poll_errors`), ``STOPPED`` -> terminated.
* **Logs**: :meth:`RayPool.logs` is the job's driver log as Ray keeps it. **Terminate** is ``stop_job``.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from broker.errors import AuthError, InvalidRequestError, ProviderError, TransientError
from broker.model import (
    Capacity,
    Instance,
    InstanceState,
    InstanceType,
    JobSpec,
    Location,
    Offer,
    SiteKind,
)

from .base import TAG_JOB, TAG_REQUEST, Capability, launch_tags, matches_tags, require_count

__all__ = ["RayPool", "ray_state", "submission_id"]

TAG_NODE = "hb-node"
_STATES = {
    "PENDING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "SUCCEEDED": InstanceState.SUCCEEDED,
    "FAILED": InstanceState.FAILED,
    "STOPPED": InstanceState.TERMINATED,
}


def ray_state(status: Any) -> InstanceState:
    """The instance state of a Ray ``JobStatus`` (or its name)."""
    return _STATES.get(str(getattr(status, "value", status)).upper(), InstanceState.UNKNOWN)


def submission_id(request_id: str, node: int) -> str:
    """The Ray submission id of node ``node`` of a launch: ``hb-<16 hex of sha256(request id)>-<node>``."""
    return f"hb-{hashlib.sha256(request_id.encode()).hexdigest()[:16]}-{node}"


class RayPool:
    """A :class:`providers.base.Provider` named ``ray`` over one Ray cluster (see the module docstring).

    ``address`` is the dashboard's HTTP address (default ``http://127.0.0.1:8265``); ``pool`` the offer's
    instance type name; ``site`` its region; ``node_usd_per_hour`` the owned cost of a node. Each option left
    ``None`` is read from ``BROKER_RAY_*`` in ``env`` (default ``os.environ``; see docs/PROVIDERS.md).
    ``data_dir`` and ``clock`` are accepted for the registry's uniform call and not used: the cluster keeps
    every state that matters.
    """

    name = "ray"
    capabilities = frozenset({Capability.RUNS_WORK, Capability.GPUS, Capability.MULTI_NODE, Capability.TAGS})

    def __init__(
        self,
        data_dir: Any = None,
        *,
        address: str | None = None,
        pool: str | None = None,
        site: str | None = None,
        node_usd_per_hour: float | None = None,
        offers_ttl_seconds: float = 5.0,
        env: Mapping[str, str] | None = None,
        clock: Any = None,
    ) -> None:
        env = os.environ if env is None else env
        self.address = (address or env.get("BROKER_RAY_ADDRESS") or "http://127.0.0.1:8265").rstrip("/")
        if "://" not in self.address:
            self.address = "http://" + self.address
        self.pool = pool or env.get("BROKER_RAY_POOL") or "ray"
        self.site = site or env.get("BROKER_RAY_SITE") or "local"
        if node_usd_per_hour is None:
            node_usd_per_hour = float(env.get("BROKER_RAY_NODE_USD_PER_HOUR") or 0.0)
        self.node_usd_per_hour = node_usd_per_hour
        self.offers_ttl_seconds = offers_ttl_seconds
        self._client: Any = None
        self._lock = threading.RLock()
        self._offers: tuple[float, list[Offer]] | None = None
        self._errors: list[ProviderError] = []
        self._reported: set[str] = set()

    # -- the client -------------------------------------------------------------------------------------

    def _kw(self, request_id: str | None = None) -> dict[str, Any]:
        return {"provider": self.name, "region": self.site, "request_id": request_id}

    def _jobs(self) -> Any:
        """The ``JobSubmissionClient`` (built at first use: building it already calls the cluster)."""
        with self._lock:
            if self._client is None:
                try:
                    from ray.job_submission import JobSubmissionClient
                except ImportError as exc:
                    raise AuthError(
                        f"ray: the ray package is not installed ({exc.name}). To fix: pip install "
                        "'hybrid-broker[ray]'.", **self._kw(),
                    ) from exc
                self._client = self._call(lambda: JobSubmissionClient(self.address), "connect")
            return self._client

    def _call(self, fn: Any, what: str, request_id: str | None = None) -> Any:
        try:
            return fn()
        except ProviderError:
            raise
        except (ConnectionError, OSError, TimeoutError) as exc:
            raise TransientError(
                f"ray: {what} failed, the cluster at {self.address} does not answer ({exc}). To fix: check that "
                "the Ray head runs (ray start --head) and BROKER_RAY_ADDRESS.", code="unreachable",
                **self._kw(request_id),
            ) from exc
        except RuntimeError as exc:  # the client's "Request failed with status code N: ..."
            text = str(exc)
            if "status code 4" in text:
                raise InvalidRequestError(f"ray: {what} refused: {text[:500]}", code="invalid",
                                          **self._kw(request_id)) from exc
            if "connect" in text.lower() or "failed to connect" in text.lower():
                raise TransientError(f"ray: {what} failed: {text[:500]}. To fix: check the Ray head.",
                                     code="unreachable", **self._kw(request_id)) from exc
            raise TransientError(f"ray: {what} failed: {text[:500]}", code="ray", **self._kw(request_id)) from exc
        except Exception as exc:  # noqa: BLE001 - requests' errors and the like: the cluster is unreachable
            if type(exc).__module__.startswith(("requests", "urllib3", "aiohttp")):
                raise TransientError(f"ray: {what} failed: {exc}. To fix: check the Ray head and "
                                     "BROKER_RAY_ADDRESS.", code="unreachable", **self._kw(request_id)) from exc
            raise

    # -- offers and capacity ------------------------------------------------------------------------------

    def _nodes(self) -> list[dict[str, float]]:
        from ray.util.state import list_nodes

        self._jobs()  # a missing package or an unreachable cluster is reported the same way as for jobs
        nodes = self._call(lambda: list_nodes(address=self.address, limit=10_000, raise_on_missing_output=False),
                           "list nodes")
        out = []
        for n in nodes:
            if str(getattr(n, "state", "")).upper() != "ALIVE":
                continue
            res = dict(getattr(n, "resources_total", {}) or {})
            out.append({"vcpus": float(res.get("CPU", 0.0)), "memory_gib": float(res.get("memory", 0.0)) / 2**30,
                        "gpus": float(res.get("GPU", 0.0))})
        return out

    def offers(self) -> list[Offer]:
        """One offer for the cluster, shaped like its largest alive node (cached ``offers_ttl_seconds``)."""
        with self._lock:
            cached = self._offers
            if cached is not None and time.monotonic() - cached[0] < self.offers_ttl_seconds:
                return list(cached[1])
        nodes = [n for n in self._nodes() if n["vcpus"] > 0]
        offers = []
        if nodes:
            big = max(nodes, key=lambda n: (n["gpus"], n["vcpus"], n["memory_gib"]))
            offers.append(Offer(
                instance_type=InstanceType(name=self.pool, vcpus=big["vcpus"], memory_gib=round(big["memory_gib"], 3),
                                           gpus=int(big["gpus"])),
                location=Location(self.name, self.site, None, SiteKind.ONPREM),
                capacity=Capacity.OWNED,
                hourly_usd=self.node_usd_per_hour,
                source="ray",
            ))
        with self._lock:
            self._offers = (time.monotonic(), offers)
        return list(offers)

    def free(self) -> dict[str, dict[str, float]]:
        """``{pool: {nodes, vcpus, memory_gib, gpus}}`` summed over the alive nodes (Ray queues the rest)."""
        nodes = self._nodes()
        return {self.pool: {"nodes": float(len(nodes)), "vcpus": sum(n["vcpus"] for n in nodes),
                            "memory_gib": round(sum(n["memory_gib"] for n in nodes), 3),
                            "gpus": sum(n["gpus"] for n in nodes)}}

    # -- lifecycle ------------------------------------------------------------------------------------

    def launch(
        self,
        offer: Offer,
        count: int,
        request_id: str,
        *,
        tags: Mapping[str, str],
        job: JobSpec | None = None,
    ) -> list[Instance]:
        """Submit ``count`` Ray jobs running ``job.command`` (idempotent per ``request_id``, see the module
        docstring). Raises ``InvalidRequestError`` for a job without a command."""
        require_count(self.name, offer, count, request_id)
        if job is None or not job.command:
            raise InvalidRequestError("ray: a Ray job needs the job's command. To fix: set spec.command.",
                                      **self._kw(request_id))
        client = self._jobs()
        all_tags = launch_tags(tags, request_id)
        out = []
        for n in range(count):
            sid = submission_id(request_id, n)
            info = self._info(sid, request_id)
            if info is None:
                try:
                    self._submit(client, sid, n, all_tags, job, request_id)
                except ProviderError:
                    info = self._info(sid, request_id)  # another process submitted this id meanwhile: that one
                    if info is None:
                        raise
            out.append(self._to_instance(info or self._info(sid, request_id) or {"submission_id": sid,
                                                                                 "status": "PENDING",
                                                                                 "metadata": all_tags}))
        return out

    def _info(self, sid: str, request_id: str) -> Any:
        try:
            return self._call(lambda: self._jobs().get_job_info(sid), "get job", request_id)
        except InvalidRequestError:
            return None  # 404: no such job

    def _submit(self, client: Any, sid: str, node: int, tags: Mapping[str, str], job: JobSpec,
                request_id: str) -> None:
        req = job.request
        entry = shlex.join(job.command)
        if job.workdir:
            entry = f"mkdir -p {shlex.quote(job.workdir)} && cd {shlex.quote(job.workdir)} && {entry}"
        env = {str(k): str(v) for k, v in job.env.items()}
        env.update({"HB_JOB": tags.get(TAG_JOB, ""), "HB_INSTANCE_ID": sid, "HB_NODE": str(node)})
        kwargs: dict[str, Any] = {
            "entrypoint": entry,
            "submission_id": sid,
            "runtime_env": {"env_vars": env},
            "metadata": {**{str(k): str(v) for k, v in tags.items()}, TAG_NODE: str(node)},
            "entrypoint_num_cpus": float(req.vcpus),
        }
        if req.gpus:
            kwargs["entrypoint_num_gpus"] = float(req.gpus)
        if req.memory_gib > 0:
            kwargs["entrypoint_memory"] = int(req.memory_gib * 2**30)
        self._call(lambda: client.submit_job(**kwargs), "submit", request_id)

    def _to_instance(self, info: Any) -> Instance:
        get = info.get if isinstance(info, dict) else (lambda k, d=None: getattr(info, k, d))
        sid = str(get("submission_id"))
        status = get("status")
        state = ray_state(status)
        meta = dict(get("metadata") or {})
        exit_code = get("driver_exit_code")
        if state is InstanceState.SUCCEEDED:
            exit_code = 0 if exit_code is None else exit_code
        elif state is not InstanceState.FAILED:
            exit_code = None
        elif exit_code is None and sid not in self._reported:
            self._reported.add(sid)
            self._errors.append(TransientError(
                f"ray: job {sid} failed before its command ended ({get('error_type') or 'no exit code'}: "
                f"{str(get('message') or '')[:300]}).", code=str(get("error_type") or "failed").lower(),
                **self._kw(meta.get(TAG_REQUEST)),
            ))
        start = get("start_time")
        return Instance(
            id=sid,
            provider=self.name,
            region=self.site,
            zone=None,
            instance_type=self.pool,
            state=state,
            tags=meta,
            exit_code=int(exit_code) if exit_code is not None else None,
            launched_at=datetime.fromtimestamp(start / 1000.0, UTC) if start else None,
        )

    def instances(self, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """The cluster's jobs whose metadata carries ``hb-request`` and every item of ``tags``."""
        jobs = self._call(lambda: self._jobs().list_jobs(), "list jobs")
        out = []
        with self._lock:
            for info in jobs:
                meta = dict(getattr(info, "metadata", None) or {})
                sid = getattr(info, "submission_id", None)
                if sid and TAG_REQUEST in meta and matches_tags(meta, tags):
                    out.append(self._to_instance(info))
        return sorted(out, key=lambda i: i.id)

    def logs(self, instance_id: str) -> str:
        """The driver log of the run (what its command printed, after Ray's own setup lines)."""
        return str(self._call(lambda: self._jobs().get_job_logs(instance_id), "get logs"))

    def terminate(self, ids: Sequence[str], request_id: str) -> None:
        """``stop_job`` each run; unknown or ended runs are ignored."""
        for sid in ids:
            try:
                self._call(lambda s=sid: self._jobs().stop_job(s), "stop", request_id)
            except InvalidRequestError:
                continue

    def poll_errors(self) -> list[ProviderError]:
        with self._lock:
            out, self._errors = self._errors, []
            return out
