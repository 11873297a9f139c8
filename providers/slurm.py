"""On-prem pools on a real Slurm cluster: each partition is a pool, each broker run is one batch job.

The adapter drives Slurm's own command-line clients (``sbatch``, ``squeue``, ``scancel``, ``sinfo``,
``scontrol``, and ``sacct`` when accounting is on), so it works with any cluster whose clients run here;
``SLURM_CONF`` (``BROKER_SLURM_CONF``) names the cluster. Nothing home-made schedules the work: Slurm queues
it, starts it on a node of the partition and reports its state.

* **Offers** come from ``sinfo``: one offer per partition that is up and has a responding node, with the
  smallest node of the partition as its shape (vCPUs, memory, GPUs from ``gres``), site ``BROKER_SLURM_SITE``
  and capacity ``owned`` at ``BROKER_SLURM_NODE_USD_PER_HOUR``. :meth:`SlurmPool.free` reports idle CPUs.
* **Launch** submits ``count`` batch jobs (one per node of a gang) with ``sbatch --parsable``. The job name is
  ``hb-<broker job id>``; the comment carries the tags (``hb-job=..,hb-request=..,hb-node=n``, URL-quoted,
  no spaces). A launch with a request id already submitted (found in this pool's records on disk, else in
  ``squeue`` by name and comment) returns those jobs and submits nothing: idempotent per ``request_id`` even
  across a broker crash between ``sbatch`` and the record.
* **Runs**: the batch script runs the job's command in ``<log dir>/<run>/work`` with ``PATH``, ``HOME``,
  ``LANG``, ``TMPDIR``, the job's ``env`` and ``HB_JOB``, ``HB_INSTANCE_ID``, ``HB_RUN_DIR``; stdout and stderr
  go to ``stdout.log``/``stderr.log`` and the command's exit code to ``exit_code``. The log dir must be on a
  file system the nodes share when the cluster has more than one host.
* **States**: ``PENDING``/``CONFIGURING``/``REQUEUED`` -> pending; ``RUNNING``/``COMPLETING``/``SUSPENDED`` ->
  running; ``COMPLETED`` -> succeeded; ``FAILED``/``TIMEOUT``/``OUT_OF_MEMORY``/``NODE_FAIL``/... -> failed with
  the exit code (the run's ``exit_code`` file, else ``scontrol``'s ``ExitCode``); ``CANCELLED``/``PREEMPTED``
  -> terminated. Jobs Slurm no longer lists (after ``MinJobAge``) are answered from ``sacct`` when accounting
  is on, else from the run's ``exit_code`` file.
* **Terminate** is ``scancel``; a job that already ended is left alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from broker.errors import (
    AuthError,
    InvalidRequestError,
    ProviderError,
    QuotaError,
    TransientError,
)
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

__all__ = ["SlurmPool", "slurm_state", "parse_gres_gpus", "encode_comment", "decode_comment"]

TAG_NODE = "hb-node"
_PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
_DOWN = ("down", "drain", "fail", "maint", "unk", "no_respond", "future", "power")
_STATES = {
    "PENDING": InstanceState.PENDING,
    "CONFIGURING": InstanceState.PENDING,
    "REQUEUED": InstanceState.PENDING,
    "REQUEUE_HOLD": InstanceState.PENDING,
    "REQUEUE_FED": InstanceState.PENDING,
    "RESV_DEL_HOLD": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "COMPLETING": InstanceState.RUNNING,
    "SUSPENDED": InstanceState.RUNNING,
    "STOPPED": InstanceState.RUNNING,
    "SIGNALING": InstanceState.RUNNING,
    "STAGE_OUT": InstanceState.RUNNING,
    "RESIZING": InstanceState.RUNNING,
    "COMPLETED": InstanceState.SUCCEEDED,
    "FAILED": InstanceState.FAILED,
    "TIMEOUT": InstanceState.FAILED,
    "OUT_OF_MEMORY": InstanceState.FAILED,
    "NODE_FAIL": InstanceState.FAILED,
    "BOOT_FAIL": InstanceState.FAILED,
    "DEADLINE": InstanceState.FAILED,
    "SPECIAL_EXIT": InstanceState.FAILED,
    "REVOKED": InstanceState.TERMINATED,
    "CANCELLED": InstanceState.TERMINATED,
    "PREEMPTED": InstanceState.TERMINATED,
}
# Ended for reasons of the cluster, not the job: reported once through poll_errors().
_LOST = ("NODE_FAIL", "BOOT_FAIL", "PREEMPTED")


def slurm_state(state: str) -> InstanceState:
    """The instance state of a Slurm job state (``squeue %T``, ``sacct State``: ``CANCELLED by 0`` too)."""
    word = (state.split() or ["UNKNOWN"])[0].rstrip("+").upper()
    return _STATES.get(word, InstanceState.UNKNOWN)


def parse_gres_gpus(gres: str) -> tuple[int, str | None]:
    """GPUs per node and their model from a ``sinfo %G`` value: ``gpu:a100:4(S:0-1)`` -> ``(4, "a100")``."""
    for item in (gres or "").split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        try:
            return int(parts[-1]), (parts[1] if len(parts) > 2 else None)
        except ValueError:
            return 1, parts[1]
    return 0, None


def encode_comment(tags: Mapping[str, str]) -> str:
    """Tags as a Slurm job comment: ``k=v,k=v`` with keys and values URL-quoted (no spaces, commas, ``|``)."""
    return ",".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in sorted(tags.items()))


def decode_comment(comment: str) -> dict[str, str]:
    """The tags of :func:`encode_comment` (anything that is not ``k=v`` is ignored)."""
    out: dict[str, str] = {}
    for item in (comment or "").split(","):
        key, sep, value = item.partition("=")
        if sep:
            out[unquote(key)] = unquote(value)
    return out


def _job_name(job_id: str) -> str:
    return "hb-" + re.sub(r"[^A-Za-z0-9._-]", "_", job_id)[:100]


class SlurmPool:
    """A :class:`providers.base.Provider` named ``slurm`` over one Slurm cluster (see the module docstring).

    ``data_dir`` holds ``slurm/`` (records and, unless ``log_dir`` is given, the runs' logs). ``conf`` is the
    cluster's ``slurm.conf`` (``SLURM_CONF`` for every client call); ``partitions`` limits the pools (default:
    every partition); ``site`` is the offers' region (their place in the egress model); ``node_usd_per_hour``
    the owned cost of a node; ``bin_dir`` where the Slurm clients are (default: ``PATH``). Each option left
    ``None`` is read from ``BROKER_SLURM_*`` in ``env`` (default ``os.environ``; see docs/PROVIDERS.md).
    """

    name = "slurm"
    capabilities = frozenset({Capability.RUNS_WORK, Capability.GPUS, Capability.MULTI_NODE, Capability.TAGS})

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        conf: str | os.PathLike[str] | None = None,
        partitions: Sequence[str] | None = None,
        site: str | None = None,
        node_usd_per_hour: float | None = None,
        bin_dir: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        timeout_seconds: float = 30.0,
        offers_ttl_seconds: float = 5.0,
        env: Mapping[str, str] | None = None,
        clock: Any = None,
    ) -> None:
        env = os.environ if env is None else env
        base = Path(data_dir or env.get("BROKER_DATA_DIR") or "~/.hybrid-broker").expanduser()
        conf = conf or env.get("BROKER_SLURM_CONF") or env.get("SLURM_CONF") or None
        self.conf = str(Path(conf).expanduser().resolve()) if conf else None
        if partitions is None:
            raw = env.get("BROKER_SLURM_PARTITIONS") or ""
            partitions = [p.strip() for p in raw.split(",") if p.strip()]
        self.partitions = tuple(partitions)
        self.site = site or env.get("BROKER_SLURM_SITE") or "local"
        if node_usd_per_hour is None:
            node_usd_per_hour = float(env.get("BROKER_SLURM_NODE_USD_PER_HOUR") or 0.0)
        self.node_usd_per_hour = node_usd_per_hour
        bin_dir = bin_dir or env.get("BROKER_SLURM_BIN_DIR") or None
        self.bin_dir = Path(bin_dir).expanduser() if bin_dir else None
        self.dir = base / "slurm"
        self.runs_dir = Path(log_dir or env.get("BROKER_SLURM_LOG_DIR") or self.dir / "runs").expanduser()
        self.records_dir = self.dir / "requests"
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.timeout_seconds = timeout_seconds
        self.offers_ttl_seconds = offers_ttl_seconds
        self._lock = threading.RLock()
        self._offers: tuple[float, list[Offer]] | None = None
        self._errors: list[ProviderError] = []
        self._reported: set[str] = set()
        self._records: dict[str, dict[str, Any]] = {}  # request id -> record
        self._by_instance: dict[str, tuple[str, int]] = {}  # instance id -> (request id, node)
        self._accounting: bool | None = None
        self._final: dict[str, Instance] = {}  # slurm id -> its instance, once it ended
        self._launching: dict[str, list[Any]] = {}  # request id -> [its launch lock, holders and waiters]
        self._load_records()

    # -- running the clients --------------------------------------------------------------------------

    def _client_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        if extra:
            env.update(extra)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        elif "SLURM_CONF" in os.environ:
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        return env

    def _exe(self, tool: str) -> str:
        path = str(self.bin_dir / tool) if self.bin_dir else shutil.which(tool)
        if not path or not os.access(path, os.X_OK):
            raise AuthError(
                f"slurm: {tool} not found{' in ' + str(self.bin_dir) if self.bin_dir else ' on PATH'}. To fix: "
                "install the Slurm clients (Debian: apt-get install slurm-client) or set BROKER_SLURM_BIN_DIR.",
                provider=self.name, region=self.site,
            )
        return path

    def _run(self, tool: str, *args: str, stdin: str | None = None, env: Mapping[str, str] | None = None,
             request_id: str | None = None, ok_errors: tuple[str, ...] = ()) -> str:
        """stdout of ``tool args``; a failure becomes a classified :class:`ProviderError`."""
        cmd = [self._exe(tool), *args]
        try:
            done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=self.timeout_seconds,
                                  env=self._client_env(env), check=False)
        except subprocess.TimeoutExpired:
            raise TransientError(
                f"slurm: {tool} did not answer within {self.timeout_seconds:g} s. To fix: check slurmctld.",
                provider=self.name, region=self.site, request_id=request_id, code="timeout",
            ) from None
        if done.returncode == 0 or any(e in done.stderr for e in ok_errors):
            return done.stdout
        raise self._error(tool, done.stderr.strip() or done.stdout.strip(), request_id)

    def _error(self, tool: str, text: str, request_id: str | None) -> ProviderError:
        low = text.lower()
        message = f"slurm: {tool} failed: {text[:500]}"
        kw: dict[str, Any] = {"provider": self.name, "region": self.site, "request_id": request_id}
        if any(s in low for s in ("unable to contact", "socket timed out", "connection refused",
                                  "slurm_persist_conn", "try again", "temporarily unavailable", "munge")):
            return TransientError(message + ". To fix: check that slurmctld (and munged) run.", code="unreachable",
                                  **kw)
        if any(s in low for s in ("qosmax", "assocmax", "maxsubmit", "job limit", "reached")):
            return QuotaError(message + ". To fix: wait for jobs to end or raise the limit.", code="limit", **kw)
        if any(s in low for s in ("invalid", "not available", "unrecognized", "requested node configuration")):
            return InvalidRequestError(message + ". To fix: check the partition and the job's request.",
                                       code="invalid", **kw)
        return TransientError(message, code="slurm", **kw)

    # -- offers and capacity --------------------------------------------------------------------------

    def _nodes(self) -> list[dict[str, Any]]:
        out = self._run("sinfo", "-h", "-N", "-o", "%N|%R|%a|%c|%m|%G|%T|%C")
        nodes = []
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 8:
                continue
            name, part, avail, cpus, mem, gres, state, cpu_state = parts
            if self.partitions and part not in self.partitions:
                continue
            alloc, idle, *_ = (cpu_state.split("/") + ["0", "0"])[:4]
            gpus, model = parse_gres_gpus(gres)
            nodes.append({
                "node": name, "partition": part, "up": avail.startswith("up")
                and not any(state.lower().startswith(d) for d in _DOWN) and not state.endswith("*"),
                "vcpus": float(cpus.rstrip("+")), "memory_gib": round(int(mem.rstrip("+")) / 1024.0, 3),
                "gpus": gpus, "accelerator": model, "idle_vcpus": float(idle or 0), "state": state,
            })
        return nodes

    def offers(self) -> list[Offer]:
        """One offer per partition that is up with at least one responding node (cached ``offers_ttl_seconds``)."""
        with self._lock:
            cached = self._offers
            if cached is not None and time.monotonic() - cached[0] < self.offers_ttl_seconds:
                return list(cached[1])
        by_part: dict[str, list[dict[str, Any]]] = {}
        for n in self._nodes():
            if n["up"]:
                by_part.setdefault(n["partition"], []).append(n)
        offers = [self._to_offer(p, nodes) for p, nodes in sorted(by_part.items())]
        with self._lock:
            self._offers = (time.monotonic(), offers)
        return list(offers)

    def _to_offer(self, partition: str, nodes: list[dict[str, Any]]) -> Offer:
        small = min(nodes, key=lambda n: (n["vcpus"], n["memory_gib"], n["gpus"]))
        return Offer(
            instance_type=InstanceType(
                name=partition, vcpus=small["vcpus"], memory_gib=min(n["memory_gib"] for n in nodes),
                gpus=min(n["gpus"] for n in nodes), accelerator=small["accelerator"],
            ),
            location=Location(self.name, self.site, None, SiteKind.ONPREM),
            capacity=Capacity.OWNED,
            hourly_usd=self.node_usd_per_hour,
            source="sinfo",
        )

    def free(self) -> dict[str, dict[str, float]]:
        """Per partition: responding ``nodes``, total and idle ``vcpus`` (from ``sinfo``; Slurm queues the rest)."""
        out: dict[str, dict[str, float]] = {}
        for n in self._nodes():
            if not n["up"]:
                continue
            p = out.setdefault(n["partition"], {"nodes": 0.0, "vcpus": 0.0, "idle_vcpus": 0.0})
            p["nodes"] += 1
            p["vcpus"] += n["vcpus"]
            p["idle_vcpus"] += n["idle_vcpus"]
        return out

    # -- records ----------------------------------------------------------------------------------------

    @staticmethod
    def _digest(request_id: str) -> str:
        return hashlib.sha256(request_id.encode()).hexdigest()[:16]

    def _record_path(self, request_id: str) -> Path:
        return self.records_dir / f"{self._digest(request_id)}.json"

    def _save(self, rec: dict[str, Any]) -> None:
        path = self._record_path(rec["request_id"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, sort_keys=True))
        os.replace(tmp, path)
        self._index(rec)

    def _index(self, rec: dict[str, Any]) -> None:
        self._records[rec["request_id"]] = rec
        for run in rec["runs"]:
            self._by_instance[f"slurm-{run['slurm_id']}"] = (rec["request_id"], run["node"])

    def _load_records(self) -> None:
        for path in sorted(self.records_dir.glob("*.json")):
            try:
                self._index(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError):
                continue

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
        """Submit ``count`` batch jobs of ``job`` to the offer's partition (idempotent per ``request_id``).

        Raises ``InvalidRequestError`` for a job without a command, a classified ``ProviderError`` when
        ``sbatch`` refuses."""
        require_count(self.name, offer, count, request_id)
        if job is None or not job.command:
            raise InvalidRequestError(
                "slurm: a batch job needs the job's command. To fix: set spec.command in the job.",
                provider=self.name, region=offer.region, request_id=request_id,
            )
        all_tags = launch_tags(tags, request_id)
        # One launch per request id at a time; launches of different requests run their squeue/sbatch
        # commands concurrently (the scheduler may launch several jobs at once), the pool's own state under
        # its lock only while it changes.
        with self._request_lock(request_id):
            with self._lock:
                rec = self._records.get(request_id)
            if rec is None:
                rec = {"request_id": request_id, "tags": all_tags, "partition": offer.instance_type.name,
                       "runs": [], "terminated": [], "launched_at": datetime.now(UTC).isoformat()}
                # A broker that died between sbatch and its record: the jobs are in squeue by name + comment.
                for row in self._squeue(name=_job_name(all_tags[TAG_JOB])):
                    if row["tags"].get(TAG_REQUEST) == request_id:
                        node = int(row["tags"].get(TAG_NODE, 0))
                        rec["runs"].append({"node": node, "slurm_id": row["id"],
                                            "run_dir": str(self._run_dir(request_id, node))})
                if rec["runs"]:
                    with self._lock:
                        self._save(rec)
            have = {r["node"] for r in rec["runs"]}
            for n in range(count):
                if n in have:
                    continue
                slurm_id = self._submit(offer, request_id, n, all_tags, job)
                with self._lock:
                    rec["runs"].append({"node": n, "slurm_id": slurm_id,
                                        "run_dir": str(self._run_dir(request_id, n))})
                    self._save(rec)
            with self._lock:
                rec["runs"].sort(key=lambda r: r["node"])
                # Just submitted (or found): reported pending; instances() reads the live state.
                pending = {"state": "PENDING", "nodes": ""}
                return [self._to_instance(rec, run, pending) for run in rec["runs"][:max(count, 1)]]

    @contextlib.contextmanager
    def _request_lock(self, request_id: str) -> Iterator[None]:
        """Held while ``request_id`` is launched (a lock per request id, dropped when no one holds it)."""
        with self._lock:
            entry = self._launching.setdefault(request_id, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    self._launching.pop(request_id, None)

    def _run_dir(self, request_id: str, node: int) -> Path:
        return self.runs_dir / f"{self._digest(request_id)}-{node}"

    def _submit(self, offer: Offer, request_id: str, node: int, tags: Mapping[str, str], job: JobSpec) -> str:
        run_dir = self._run_dir(request_id, node)
        work = run_dir / "work"
        work.mkdir(parents=True, exist_ok=True)
        for stale in ("exit_code", "stdout.log", "stderr.log"):
            (run_dir / stale).unlink(missing_ok=True)
        cwd = str(work)
        if job.workdir:
            cwd = job.workdir if Path(job.workdir).is_absolute() else str(work / job.workdir)
        req = job.request
        args = ["--parsable", "-J", _job_name(tags[TAG_JOB]),
                "--comment", encode_comment({**tags, TAG_NODE: str(node)}),
                "-p", offer.instance_type.name, "-N", "1", "-n", "1",
                "-c", str(max(1, math.ceil(req.vcpus - 1e-9))),
                "-o", str(run_dir / "stdout.log"), "-e", str(run_dir / "stderr.log"),
                "-D", str(work), "--export=ALL"]
        if req.memory_gib > 0:
            args.append(f"--mem={max(1, math.ceil(req.memory_gib * 1024))}M")
        if req.gpus:
            args.append(f"--gres=gpu:{req.gpus}")
        env = dict(job.env)
        env.update({"HB_JOB": tags.get(TAG_JOB, ""), "HB_RUN_DIR": str(run_dir), "HB_NODE": str(node),
                    "HB_CHECKPOINT_DIR": job.checkpoint.path if job.checkpoint else str(run_dir / "checkpoint")})
        exit_file = shlex.quote(str(run_dir / "exit_code"))
        script = "\n".join([
            "#!/bin/sh",
            f"# hybrid-broker job {tags.get(TAG_JOB, '')}, request {request_id}, node {node}",
            "HB_INSTANCE_ID=slurm-$SLURM_JOB_ID; export HB_INSTANCE_ID",
            f"mkdir -p {shlex.quote(cwd)} && cd {shlex.quote(cwd)} || exit 126",
            shlex.join(job.command),
            "rc=$?",
            f"printf '%s\\n' \"$rc\" > {exit_file}.tmp && mv {exit_file}.tmp {exit_file}",
            "exit $rc",
            "",
        ])
        out = self._run("sbatch", *args, stdin=script, env=env, request_id=request_id)
        slurm_id = out.strip().split(";")[0]
        if not slurm_id.isdigit():
            raise TransientError(f"slurm: sbatch answered {out.strip()!r}, not a job id.", provider=self.name,
                                 region=self.site, request_id=request_id)
        return slurm_id

    def _squeue(self, name: str | None = None) -> list[dict[str, Any]]:
        args = ["-h", "-t", "all", "-o", "%i|%j|%T|%P|%N|%k"]
        if name:
            args += ["--name", name]
        rows = []
        for line in self._run("squeue", *args).splitlines():
            parts = line.strip().split("|", 5)
            if len(parts) != 6 or not parts[1].startswith("hb-"):
                continue
            rows.append({"id": parts[0], "name": parts[1], "state": parts[2], "partition": parts[3],
                         "nodes": parts[4], "tags": decode_comment(parts[5])})
        return rows

    def _exit_code(self, run: dict[str, Any]) -> int | None:
        try:
            return int((Path(run["run_dir"]) / "exit_code").read_text().strip())
        except (OSError, ValueError):
            return None

    def _scontrol_exit(self, slurm_id: str) -> int | None:
        try:
            out = self._run("scontrol", "-o", "show", "job", slurm_id)
        except ProviderError:
            return None
        m = re.search(r"\bExitCode=(\d+):(\d+)", out)
        if not m:
            return None
        code, sig = int(m.group(1)), int(m.group(2))
        return -sig if sig and not code else code

    def _sacct(self, ids: Sequence[str]) -> dict[str, tuple[str, int | None]]:
        """``slurm id -> (State, exit code)`` from accounting; empty when accounting is off."""
        if not ids or self._accounting is False:
            return {}
        try:
            out = self._run("sacct", "-n", "-X", "-P", "-j", ",".join(ids), "-o", "JobID,State,ExitCode")
        except ProviderError:
            return {}
        if "accounting storage is disabled" in out.lower():
            self._accounting = False
            return {}
        self._accounting = True
        found = {}
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[0] in ids:
                code, _, sig = parts[2].partition(":")
                found[parts[0]] = (parts[1], int(code) if code.isdigit() else None)
        return found

    def _to_instance(self, rec: dict[str, Any], run: dict[str, Any], row: dict[str, Any] | None,
                     acct: tuple[str, int | None] | None = None) -> Instance:
        sid = run["slurm_id"]
        final = self._final.get(sid)
        if final is not None:  # an ended job does not change any more: no file or client call per poll
            return final
        exit_code: int | None = None
        if row is not None:
            raw_state = row["state"]
        elif acct is not None:
            raw_state = acct[0]
        else:  # neither squeue nor accounting knows it any more: what the run wrote
            exit_code = self._exit_code(run)
            raw_state = "" if exit_code is None else ("COMPLETED" if exit_code == 0 else "FAILED")
            if exit_code is None and sid in rec.get("terminated", []):
                raw_state = "CANCELLED"
        state = slurm_state(raw_state)
        if state in (InstanceState.SUCCEEDED, InstanceState.FAILED) and exit_code is None:
            exit_code = self._exit_code(run)
            if exit_code is None:
                exit_code = acct[1] if acct is not None else (0 if state is InstanceState.SUCCEEDED
                                                               else self._scontrol_exit(sid))
        if state is InstanceState.FAILED and exit_code == 0:
            exit_code = None  # killed by the cluster (node failure, time limit) before the command ended
        word = (raw_state.split() or [""])[0]
        if word in _LOST and sid not in self._reported:
            self._reported.add(sid)
            self._errors.append(ProviderError(
                f"slurm: job {sid} ended {word} on {row['nodes'] if row else 'its node'}. To fix: check the node.",
                provider=self.name, region=self.site, request_id=rec["request_id"], code=word.lower(),
                retryable=True,
            ))
        inst = Instance(
            id=f"slurm-{sid}",
            provider=self.name,
            region=self.site,
            zone=None,
            instance_type=rec["partition"],
            state=state,
            tags={**rec["tags"], TAG_NODE: str(run["node"])},
            exit_code=exit_code,
            launched_at=datetime.fromisoformat(rec["launched_at"]),
        )
        if state in (InstanceState.SUCCEEDED, InstanceState.FAILED, InstanceState.TERMINATED) and row is not None:
            self._final[sid] = inst
        return inst

    def instances(self, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """This pool's batch jobs (from its records, states from ``squeue``/``sacct``), plus jobs named
        ``hb-*`` that ``squeue`` lists but no record knows (another broker's, or lost records)."""
        rows = {r["id"]: r for r in self._squeue()}
        with self._lock:
            recs = [r for r in self._records.values() if matches_tags(r["tags"], tags)]
            gone = [run["slurm_id"] for rec in recs for run in rec["runs"] if run["slurm_id"] not in rows]
            acct = self._sacct(gone)
            out = [self._to_instance(rec, run, rows.get(run["slurm_id"]), acct.get(run["slurm_id"]))
                   for rec in recs for run in rec["runs"]]
            known = {f"slurm-{run['slurm_id']}" for rec in self._records.values() for run in rec["runs"]}
        for sid, row in rows.items():
            if f"slurm-{sid}" in known or TAG_REQUEST not in row["tags"]:
                continue
            # Submitted by another broker process (a leader that died, another replica): adopted into this
            # pool's records, so its logs and exit code are found here too (the log dir is shared).
            request_id, node = row["tags"][TAG_REQUEST], int(row["tags"].get(TAG_NODE, 0))
            with self._lock:
                rec = self._records.get(request_id) or {
                    "request_id": request_id, "partition": row["partition"], "runs": [], "terminated": [],
                    "tags": {k: v for k, v in row["tags"].items() if k != TAG_NODE},
                    "launched_at": datetime.now(UTC).isoformat()}
                run = {"node": node, "slurm_id": sid, "run_dir": str(self._run_dir(request_id, node))}
                rec["runs"].append(run)
                self._save(rec)
            if matches_tags(rec["tags"], tags):
                out.append(self._to_instance(rec, run, row))
        return sorted(out, key=lambda i: i.id)

    def logs(self, instance_id: str) -> tuple[Path, Path]:
        """Paths of the run's ``stdout.log`` and ``stderr.log`` (``NotFoundError``-free: unknown ids raise
        ``InvalidRequestError``)."""
        run = self._run_of(instance_id)
        d = Path(run["run_dir"])
        return d / "stdout.log", d / "stderr.log"

    def _run_of(self, instance_id: str) -> dict[str, Any]:
        with self._lock:
            where = self._by_instance.get(instance_id)
            if where is None:
                raise InvalidRequestError(f"slurm: no run {instance_id!r} in this pool's records.",
                                          provider=self.name, region=self.site)
            rec = self._records[where[0]]
            return next(r for r in rec["runs"] if r["node"] == where[1])

    def terminate(self, ids: Sequence[str], request_id: str) -> None:
        """``scancel`` each job by instance id (``slurm-<job id>``); unknown or ended jobs are ignored."""
        sids = [i.removeprefix("slurm-") for i in ids if i.startswith("slurm-") and i[6:].isdigit()]
        if not sids:
            return
        self._run("scancel", *sids, request_id=request_id,
                  ok_errors=("Invalid job id", "already completing or completed", "Job has already finished"))
        with self._lock:
            for iid in ids:
                where = self._by_instance.get(iid)
                if where is not None:
                    rec = self._records[where[0]]
                    sid = iid.removeprefix("slurm-")
                    if sid not in rec["terminated"]:
                        rec["terminated"].append(sid)
                        self._save(rec)

    def poll_errors(self) -> list[ProviderError]:
        with self._lock:
            out, self._errors = self._errors, []
            return out
