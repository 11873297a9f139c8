"""The on-prem pool: own hosts from an inventory; the ``local`` host (``localhost``) runs work for real.

For a host marked ``local`` a launch starts the job's ``command`` as a subprocess (through the small
``_runner.py`` wrapper) in ``<data_dir>/runs/<instance id>/work`` with the job's environment; stdout and
stderr go to ``stdout.log``/``stderr.log``; the exit code, CPU seconds and peak RSS land in ``exit.json``.
Cancel is SIGTERM to the run's process group, then SIGKILL after ``grace_seconds``.

Capacity is tracked per host (vCPUs, memory, GPUs): the pool never runs more than a host has, and
``launch`` raises :class:`broker.errors.CapacityError` when a host is full. Hosts that are not local are
*simulated* (like :mod:`providers.dryrun`): instances are marked ``dry_run`` and succeed after the job's
duration on the clock, while still holding their capacity.

State that matters is on disk (``run.json`` per run), so a restarted broker re-adopts live runs (their
processes are checked by pid and start time) and can clean up the rest by tag.

Who a job runs as (:mod:`providers.sandbox`, ``sandbox=``): with ``user`` (or ``auto`` as root) each
namespace's jobs run as its own unprivileged system user (``hbj-<namespace>``, no supplementary groups,
umask 077) in a work directory only that user owns (``0700``); the run's logs and ``run.json`` stay
root-owned ``0600``. ``workingDir`` is a relative path inside the work directory (``..``, absolute paths
and symlinks out are refused).

Environment of a job: a fixed ``PATH``, ``HOME`` and ``TMPDIR`` in its work directory, ``LANG``, then the
job's ``env``, then ``HB_JOB``, ``HB_INSTANCE_ID``, ``HB_RUN_DIR``, ``HB_CHECKPOINT_DIR`` and, when GPUs
were allocated, ``CUDA_VISIBLE_DEVICES``. Design choice: nothing of the broker's own environment (tokens,
database URL, cloud keys) is passed.

Launch order (so a broker killed at any point never runs a job twice): ``run.json`` is written with the
run's intent (no pid yet) *before* the process starts, then again with its pid and start time. A pool that
finds an intent without a pid (the broker died in between) looks the runner up in ``/proc`` by its run
directory and adopts it; when no runner exists the launch never happened and the run reports FAILED
(never started), so the job is retried with a new request id instead of being started a second time.
:meth:`OnPremPool.adopt` re-reads runs another broker process wrote (a new scheduler leader sharing the
data directory calls it on takeover).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from broker.clock import Clock, SystemClock
from broker.errors import CapacityError, InvalidRequestError, NotFoundError, ProviderError
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

from .base import TAG_JOB, Capability, launch_tags, matches_tags, require_count
from .sandbox import Sandbox, clean_env, safe_workdir, secure_data_dir

__all__ = ["OnPremPool", "HostLike", "InventoryLike", "LocalHost"]

_RUNNER = str(Path(__file__).with_name("_runner.py"))
_TERMINATED_MARK = "terminated"  # an empty file in a run's directory: the ended run was terminated (clean-up)
TAG_NAMESPACE = "hb-namespace"  # as broker.scheduler.TAG_NAMESPACE: whose user a run gets


class HostLike(Protocol):
    """What the pool reads of an inventory host (``pricing.inventory.Host``)."""

    name: str
    site: str
    vcpus: float
    memory_gib: float
    gpus: int
    accelerator: str | None
    arch: str
    owned_usd_per_hour: float
    local: bool


class InventoryLike(Protocol):
    """What the pool reads of an inventory (``pricing.inventory.Inventory``)."""

    @property
    def hosts(self) -> Sequence[Any]: ...

    def offers(self) -> list[Offer]: ...


@dataclass(frozen=True)
class LocalHost:
    """This machine as a host (used when no inventory is given)."""

    name: str = "localhost"
    site: str = "local"
    vcpus: float = float(os.cpu_count() or 1)
    memory_gib: float = 0.0
    gpus: int = 0
    accelerator: str | None = None
    arch: str = "amd64"
    owned_usd_per_hour: float = 0.0
    local: bool = True


def _mem_total_gib() -> float:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / (1024.0 * 1024.0)
    except OSError:
        pass
    return 4.0


def _find_runner(run_dir: Path) -> int | None:
    """The pid of a live ``_runner.py`` process started for ``run_dir`` (from ``/proc/*/cmdline``), or None."""
    want = str(run_dir).encode()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[1].endswith(b"_runner.py") and want in argv[2:5]:
            return pid
    return None


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or ``None`` when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


class OnPremPool:
    """A :class:`providers.base.Provider` named ``onprem`` over an inventory (see the module docstring).

    ``inventory`` is a ``pricing.inventory.Inventory`` (anything with ``hosts`` and ``offers()``) or ``None``
    for this machine alone. ``data_dir`` holds ``runs/<instance id>/``. ``clock`` times simulated hosts.
    ``sandbox`` is a :class:`providers.sandbox.Sandbox` or its mode (``user`` | ``auto`` | ``off``; the
    library default is ``off``, ``broker serve`` passes ``BROKER_ONPREM_SANDBOX``, default ``auto``).
    """

    name = "onprem"
    capabilities = frozenset({Capability.RUNS_WORK, Capability.GPUS, Capability.MULTI_NODE, Capability.TAGS})

    def __init__(
        self,
        inventory: InventoryLike | None,
        data_dir: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        grace_seconds: float = 10.0,
        sandbox: Sandbox | str = "off",
    ) -> None:
        if inventory is None:
            try:
                from pricing.inventory import local_inventory

                inventory = local_inventory()
            except ImportError:  # pricing needs numpy (server extra); this machine alone still works
                inventory = None
        self._inventory = inventory
        if inventory is not None:
            self._hosts: list[Any] = list(inventory.hosts)
        else:
            self._hosts = [LocalHost(memory_gib=round(_mem_total_gib(), 2))]
        self._by_host = {h.name: h for h in self._hosts}
        self.sandbox = sandbox if isinstance(sandbox, Sandbox) else Sandbox(sandbox)
        if self.sandbox.mode == "user" and not self.sandbox.can_switch and any(h.local for h in self._hosts):
            self.sandbox.user_for("")  # raises: mode user cannot run work without root (refuse to start)
        self.runs_dir = Path(data_dir) / "runs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        if self.sandbox.drops_privileges:
            secure_data_dir(data_dir)
        self._clock: Clock = clock or SystemClock()
        self.grace_seconds = grace_seconds
        self._lock = threading.RLock()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._runs: dict[str, dict[str, Any]] = {}
        self._errors: list[ProviderError] = []
        # Hosts taken out of placement (broker.ops.health: a lost host until it beats again).
        self.cordoned: set[str] = set()
        # Runs known to have ended and been terminated: adopt() does not read their run.json again (a new
        # leader adopts on every reconcile while a takeover is unresolved; the directory holds every run).
        self._settled: set[str] = set()
        self._adopt()

    # -- offers and capacity --------------------------------------------------------------------------

    def offers(self) -> list[Offer]:
        if self._inventory is not None:
            return list(self._inventory.offers())
        return [self._host_offer(h) for h in self._hosts]

    @staticmethod
    def _host_offer(h: Any) -> Offer:
        return Offer(
            instance_type=InstanceType(
                name=h.name, vcpus=h.vcpus, memory_gib=h.memory_gib, gpus=h.gpus,
                accelerator=h.accelerator, arch=h.arch,
            ),
            location=Location("onprem", h.site, None, SiteKind.ONPREM),
            capacity=Capacity.OWNED,
            hourly_usd=h.owned_usd_per_hour,
            source="inventory",
        )

    def _used(self, host: str) -> tuple[float, float, set[int]]:
        cpu = mem = 0.0
        gpus: set[int] = set()
        for iid, rec in self._runs.items():
            if rec["host"] != host or self._ended(iid, rec):
                continue
            cpu += rec["vcpus"]
            mem += rec["memory_gib"]
            gpus.update(rec.get("gpu_ids", []))
        return cpu, mem, gpus

    def free(self) -> dict[str, dict[str, float]]:
        """Free ``vcpus``, ``memory_gib`` and ``gpus`` per host name, counting live runs."""
        with self._lock:
            out = {}
            for h in self._hosts:
                if h.name in self.cordoned:
                    out[h.name] = {"vcpus": 0.0, "memory_gib": 0.0, "gpus": 0.0}
                    continue
                cpu, mem, gpus = self._used(h.name)
                out[h.name] = {
                    "vcpus": round(h.vcpus - cpu, 6),
                    "memory_gib": round(h.memory_gib - mem, 6),
                    "gpus": float(h.gpus - len(gpus)),
                }
            return out

    def _pick_host(self, offer: Offer) -> Any:
        host = self._by_host.get(offer.instance_type.name)
        if host is not None:
            return host
        same_site = [h for h in self._hosts if h.site == offer.region]
        if not same_site:
            raise InvalidRequestError(
                f"onprem: no host named {offer.instance_type.name!r} or at site {offer.region!r}. "
                f"To fix: use one of {sorted(self._by_host)} (see the inventory file).",
                provider=self.name, region=offer.region,
            )
        free = self.free()
        return max(same_site, key=lambda h: (free[h.name]["vcpus"], h.name))

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
        """Start ``count`` runs of ``job`` on the offer's host (idempotent per ``request_id``).

        Each run reserves the job's per-node request (``job.request``; the whole host shape without a job).
        Raises ``CapacityError`` when the host cannot fit all ``count`` runs now, ``InvalidRequestError``
        when a local host gets a job without a command."""
        require_count(self.name, offer, count, request_id)
        with self._lock:
            existing = sorted(i for i, r in self._runs.items() if r["request_id"] == request_id)
            if existing:
                return [self._to_instance(i, self._runs[i]) for i in existing]
            host = self._pick_host(offer)
            if host.name in self.cordoned:
                raise CapacityError(f"onprem:{host.site}: host {host.name} is cordoned (lost or drained). To fix: "
                                    "wait for its heartbeat, or place the job elsewhere.",
                                    provider=self.name, region=host.site, request_id=request_id)
            want_cpu = job.request.vcpus if job else offer.instance_type.vcpus
            want_mem = job.request.memory_gib if job else offer.instance_type.memory_gib
            want_gpu = job.request.gpus if job else offer.instance_type.gpus
            used_cpu, used_mem, used_gpus = self._used(host.name)
            if (
                used_cpu + want_cpu * count > host.vcpus + 1e-9
                or used_mem + want_mem * count > host.memory_gib + 1e-9
                or len(used_gpus) + want_gpu * count > host.gpus
            ):
                raise CapacityError(
                    f"onprem:{host.site}: host {host.name} is full ({host.vcpus - used_cpu:g} vCPU, "
                    f"{host.memory_gib - used_mem:g} GiB, {host.gpus - len(used_gpus)} GPU free; asked "
                    f"{count} x {want_cpu:g} vCPU/{want_mem:g} GiB/{want_gpu} GPU). To fix: wait for runs "
                    "to end, or place the job elsewhere.",
                    provider=self.name, region=host.site, request_id=request_id,
                )
            if host.local and (job is None or not job.command):
                raise InvalidRequestError(
                    f"onprem: host {host.name} runs work for real and needs the job's command. "
                    "To fix: set spec.command in the job.",
                    provider=self.name, region=host.site, request_id=request_id,
                )
            digest = hashlib.sha256(request_id.encode()).hexdigest()[:12]
            free_gpu_ids = [g for g in range(host.gpus) if g not in used_gpus]
            made, to_write = [], []
            for n in range(count):
                iid = f"onprem-{digest}-{n}"
                gpu_ids = free_gpu_ids[n * want_gpu : (n + 1) * want_gpu]
                rec: dict[str, Any] = {
                    "id": iid,
                    "request_id": request_id,
                    "host": host.name,
                    "site": host.site,
                    "vcpus": want_cpu,
                    "memory_gib": want_mem,
                    "gpus": want_gpu,
                    "gpu_ids": gpu_ids,
                    "tags": launch_tags(tags, request_id),
                    "launched_at": self._clock.now().isoformat(),
                    "simulated": not host.local,
                    "terminated": False,
                    "killed_signal": None,
                }
                run_dir = self.runs_dir / iid
                if host.local:
                    run_dir.mkdir(parents=True, exist_ok=True)
                    os.chmod(run_dir, 0o711)
                    assert job is not None
                    self._start(iid, rec, run_dir, job)
                else:
                    hours = job.request.duration_hours if job else 1.0
                    rec["ends_at"] = (self._clock.now() + timedelta(hours=hours)).isoformat()
                    self._runs[iid] = rec  # holds its capacity from now on
                    to_write.append((iid, rec))
                made.append(self._to_instance(iid, rec))
        # A simulated run is launched once its run.json is on disk; written outside the lock so launches on
        # several threads wait for the disk together. Nothing is returned before it is durable.
        try:
            for iid, rec in to_write:
                (self.runs_dir / iid).mkdir(parents=True, exist_ok=True)
                os.chmod(self.runs_dir / iid, 0o711)
                self._save(iid, rec)
        except OSError:  # not launched: forget the runs, and any record already written
            with self._lock:
                for iid, _ in to_write:
                    self._runs.pop(iid, None)
                    (self.runs_dir / iid / "run.json").unlink(missing_ok=True)
            raise
        return made

    def _start(self, iid: str, rec: dict[str, Any], run_dir: Path, job: JobSpec) -> None:
        """Start the run: its intent in ``run.json`` first, then the process, then its pid (module docstring)."""
        user = self.sandbox.user_for(rec["tags"].get(TAG_NAMESPACE, "default"))
        work = run_dir / "work"
        cwd = safe_workdir(work, job.workdir)  # refused before anything is written
        for d in (work, work / "tmp", cwd):
            d.mkdir(parents=True, exist_ok=True)
        ckpt_dir = run_dir / "checkpoint"
        ckpt_dir.mkdir(exist_ok=True)
        if user is not None:
            for d in (work, work / "tmp", cwd, ckpt_dir):
                os.chown(d, user.uid, user.gid)
                os.chmod(d, 0o700)
        ckpt = job.checkpoint.path if job.checkpoint else str(ckpt_dir)
        env = clean_env(work)
        env.update(job.env)
        env.update(
            {
                "HB_JOB": rec["tags"].get(TAG_JOB, ""),
                "HB_INSTANCE_ID": iid,
                "HB_RUN_DIR": str(run_dir),
                "HB_CHECKPOINT_DIR": ckpt,
            }
        )
        if rec["gpu_ids"]:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in rec["gpu_ids"])
        rec["command"] = list(job.command)
        rec["pid"] = None
        rec["user"] = user.name if user is not None else None
        self._runs[iid] = rec
        self._save(iid, rec)  # the intent: a restarted pool looks for this run's process before anything else
        as_user = ["--user", f"{user.uid}:{user.gid}"] if user is not None else []
        proc = subprocess.Popen(
            [sys.executable, _RUNNER, str(run_dir), str(cwd), *as_user, "--", *job.command],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._procs[iid] = proc
        rec["pid"] = proc.pid
        rec["start_ticks"] = _proc_start_ticks(proc.pid)
        self._save(iid, rec)

    def _alive(self, iid: str, rec: dict[str, Any]) -> bool:
        proc = self._procs.get(iid)
        if proc is not None:
            return proc.poll() is None
        pid = rec.get("pid")
        if not pid:
            return False  # an intent whose process never started (see _adopt)
        ticks = _proc_start_ticks(pid)
        return ticks is not None and ticks == rec.get("start_ticks")

    def _exit(self, iid: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self.runs_dir / iid / "exit.json").read_text())
            return data
        except (OSError, ValueError):
            return None

    def _ended(self, iid: str, rec: dict[str, Any]) -> bool:
        if rec["simulated"]:
            return bool(rec["terminated"]) or self._clock.now() >= datetime.fromisoformat(rec["ends_at"])
        return not self._alive(iid, rec)

    def _to_instance(self, iid: str, rec: dict[str, Any]) -> Instance:
        exit_code: int | None = None
        if rec["simulated"]:
            if rec["terminated"]:
                state = InstanceState.TERMINATED
            elif self._ended(iid, rec):
                state, exit_code = InstanceState.SUCCEEDED, 0
            else:
                state = InstanceState.RUNNING
        elif self._alive(iid, rec):
            state = InstanceState.RUNNING
        else:
            ex = self._exit(iid)
            if ex is not None:
                exit_code = int(ex["exit_code"])
            elif rec.get("killed_signal"):
                exit_code = -int(rec["killed_signal"])
            if rec["terminated"]:
                state = InstanceState.TERMINATED
            else:
                state = InstanceState.SUCCEEDED if exit_code == 0 else InstanceState.FAILED
        return Instance(
            id=iid,
            provider=self.name,
            region=rec["site"],
            instance_type=rec["host"],
            state=state,
            zone=None,
            tags=rec["tags"],
            exit_code=exit_code,
            launched_at=datetime.fromisoformat(rec["launched_at"]),
            dry_run=bool(rec["simulated"]),
        )

    def instances(self, tags: Mapping[str, str] | None = None) -> list[Instance]:
        with self._lock:
            return [
                self._to_instance(i, r) for i, r in sorted(self._runs.items()) if matches_tags(r["tags"], tags)
            ]

    def instance(self, instance_id: str) -> Instance:
        """One instance by id; ``NotFoundError`` when the pool never ran it."""
        with self._lock:
            return self._to_instance(instance_id, self._rec(instance_id))

    def _rec(self, instance_id: str) -> dict[str, Any]:
        rec = self._runs.get(instance_id)
        if rec is None and "/" not in instance_id and (self.runs_dir / instance_id / "run.json").exists():
            # started by another broker process on this data dir (the leader), or ended and forgotten
            rec = self._load(self.runs_dir / instance_id / "run.json", keep=False)
        if rec is None:
            raise NotFoundError(f"onprem: no run {instance_id!r}. To fix: list runs with instances().")
        return rec

    def logs(self, instance_id: str) -> tuple[Path, Path]:
        """Paths of the run's ``stdout.log`` and ``stderr.log`` (they may not exist for simulated hosts)."""
        self._rec(instance_id)
        d = self.runs_dir / instance_id
        return d / "stdout.log", d / "stderr.log"

    def usage(self, instance_id: str) -> dict[str, float] | None:
        """CPU seconds and peak RSS (MiB) of an ended run, from the kernel's accounting; ``None`` while running."""
        self._rec(instance_id)
        ex = self._exit(instance_id)
        if ex is None:
            return None
        return {"cpu_seconds": float(ex["cpu_seconds"]), "max_rss_mib": float(ex["max_rss_mib"])}

    def signal(self, instance_id: str, sig: int) -> None:
        """Send ``sig`` to the run's process group (no-op when it already ended or is simulated)."""
        with self._lock:
            rec = self._rec(instance_id)
            if rec["simulated"] or not self._alive(instance_id, rec):
                return
            try:
                os.killpg(rec["pid"], sig)
            except ProcessLookupError:
                return

    def stop(self, instance_id: str, grace_seconds: float | None = None) -> Instance:
        """SIGTERM the run, wait up to ``grace_seconds`` (default: the pool's), then SIGKILL. Returns its state.

        Preemption uses it: SIGTERM lets a job write its checkpoint before it exits."""
        grace = self.grace_seconds if grace_seconds is None else grace_seconds
        with self._lock:
            rec = self._rec(instance_id)
        if not rec["simulated"] and self._alive(instance_id, rec):
            self.signal(instance_id, signal.SIGTERM)
            deadline = time.monotonic() + max(0.0, grace)
            while self._alive(instance_id, rec) and time.monotonic() < deadline:
                time.sleep(0.02)
            if self._alive(instance_id, rec):
                with self._lock:
                    rec["killed_signal"] = int(signal.SIGKILL)
                    self._save(instance_id, rec)
                try:
                    os.killpg(rec["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc = self._procs.get(instance_id)
                if proc is not None:
                    proc.wait(5)
        return self.instance(instance_id)

    def terminate(self, ids: Sequence[str], request_id: str) -> None:
        """Stop each run (SIGTERM, grace, SIGKILL) and mark it terminated; unknown ids are ignored. Runs another
        broker process started on this data dir are adopted first (a cancel through a non-leader replica)."""
        if any(iid not in self._runs for iid in ids):
            self.adopt()
        for iid in ids:
            with self._lock:
                rec = self._runs.get(iid)
                if rec is None or rec["terminated"]:
                    continue
                was_running = not self._ended(iid, rec)
            self.stop(iid)
            with self._lock:
                rec["terminated"] = True
                if was_running:
                    self._save(iid, rec)
                else:  # ended before (the clean-up after a finished run): an empty mark, run.json stays as is
                    self._mark_terminated(iid)
                if not self._alive(iid, rec):  # ended for good: its record stays on disk, not in memory
                    self._runs.pop(iid, None)
                    self._procs.pop(iid, None)
                    self._settled.add(iid)

    def poll_errors(self) -> list[ProviderError]:
        with self._lock:
            out, self._errors = self._errors, []
            return out

    # -- persistence ------------------------------------------------------------------------------------

    def _save(self, iid: str, rec: dict[str, Any]) -> None:
        path = self.runs_dir / iid / "run.json"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(rec, sort_keys=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _mark_terminated(self, iid: str) -> None:
        """Mark an ended run terminated with an empty ``terminated`` file beside its ``run.json`` (read by
        :meth:`_load`). Design choice: the clean-up of every finished run would otherwise rewrite its
        ``run.json`` (a rename over a file, which ext4 flushes: ~3 ms a run); losing the mark in a crash only
        makes a restarted pool load that ended run once more."""
        os.close(os.open(self.runs_dir / iid / _TERMINATED_MARK, os.O_WRONLY | os.O_CREAT, 0o600))

    def adopt(self) -> int:
        """Load the runs other broker processes wrote into the runs directory since this pool started (a new
        scheduler leader sharing the data directory calls it on takeover). Returns how many were new."""
        with self._lock:
            return self._adopt()

    def _adopt(self) -> int:
        """Load every ``runs/*/run.json`` not known yet, so live runs keep their capacity and ended ones report
        their exit (runs terminated and ended are left on disk: :meth:`_rec` reads one when asked). An intent
        without a pid is resolved here (module docstring: launch order)."""
        new = 0
        for path in sorted(self.runs_dir.glob("*/run.json")):
            name = path.parent.name
            if name not in self._runs and name not in self._settled and self._load(path, keep=True) is not None:
                new += 1
        return new

    def _load(self, path: Path, *, keep: bool) -> dict[str, Any] | None:
        """The run of ``path`` (resolving an intent without a pid); kept in memory unless it was terminated
        and has ended (``keep`` False: always returned, kept only while it runs)."""
        try:
            rec: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not rec.get("terminated") and (path.parent / _TERMINATED_MARK).exists():
            rec["terminated"] = True
        if rec.get("host") not in self._by_host:
            if keep:
                self._errors.append(
                    ProviderError(
                        f"onprem: run {rec.get('id')} is on host {rec.get('host')!r}, which is no longer in "
                        "the inventory. To fix: restore the host, or remove the run's directory.",
                        provider=self.name,
                    )
                )
            return None
        if not rec.get("simulated") and not rec.get("pid") and not rec.get("never_started"):
            pid = _find_runner(path.parent)
            if pid is not None:
                rec["pid"], rec["start_ticks"] = pid, _proc_start_ticks(pid)
            elif self._exit(rec["id"]) is None:
                rec["never_started"] = True
            self._save(rec["id"], rec)
        if not (rec.get("terminated") and self._ended(rec["id"], rec)):
            self._runs[rec["id"]] = rec
        else:
            self._settled.add(rec["id"])
            if keep:
                return None
        return rec
