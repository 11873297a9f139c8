"""Several real ``broker serve`` replicas on one PostgreSQL database, launching on a real engine.

Used by ``tests/broker/test_replicas.py`` and ``bench/replicas.py`` (1 vs 3 replicas). :func:`run` submits
jobs spread over every replica, optionally SIGKILLs the scheduler leader mid-dispatch, waits for every job
to end and returns what the store and the launch side say: states, RUNNING transitions, launched attempts
and adoptions per job, launches per broker job on the engine, the leadership takeover time and jobs/s.

Two launch sides (:class:`SlurmSide`, :class:`OnPremSide`), both keeping their state outside every broker
process, which is what "launched exactly once across a failover" is about (a dry-run cloud keeps its
instances in the memory of the process that launched them, so a new leader could not see them):

* **Slurm** (a real slurmctld + slurmd): one batch job per launch, named after the broker's job. Each launch
  is two client commands (``squeue --name``, ``sbatch``), so launches are bound by the engine.
* **On-prem, simulated hosts** (:mod:`providers.onprem` with an inventory of non-local hosts): a launch is
  its ``run.json`` written (fsync) in the data directory the replicas share; a run "lasts" its duration on
  the clock and nothing is executed. This is the broker's own path at full speed: claim, place, launch,
  record, poll, and a new leader adopting runs from the shared directory.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from tests.broker.service_support import free_port, job_doc

SERVE = [sys.executable, "-c", "import sys; from broker.cli import main; main(sys.argv[1:])", "serve"]
ADMIN = "hb_replica_admin"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
LEADER_LINE = "this broker is the scheduler leader"
PG = os.environ.get("HB_TEST_PG_HOST", "127.0.0.1"), int(os.environ.get("HB_TEST_PG_PORT", "5432")), \
    os.environ.get("HB_TEST_PG_USER", "postgres")


@contextmanager
def pg_database() -> Iterator[str | None]:
    """A throwaway PostgreSQL database of its own (the leader's advisory lock is per database), dropped
    after; ``None`` when the server is unreachable."""
    import psycopg

    host, port, user = PG
    try:
        admin = psycopg.connect(f"host={host} port={port} user={user} dbname=postgres connect_timeout=3",
                                autocommit=True)
    except psycopg.OperationalError:
        yield None
        return
    name = f"hb_rep_{secrets.token_hex(4)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"postgresql+psycopg://{user}@{host}:{port}/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def prepare_database(database_url: str) -> None:
    """Migrate ``database_url`` to head and create the admin token, as the first ``broker serve`` would."""
    from datetime import UTC, datetime

    from broker.migrations import upgrade
    from broker.store import Store
    from broker.tenants import ensure_admin_token

    store = Store(database_url)
    try:
        upgrade(store.engine)
        ensure_admin_token(store, now=datetime.now(UTC), configured=ADMIN)
    finally:
        store.dispose()


def stop_all(replicas: list[Replica]) -> None:
    """SIGTERM every replica at once, then wait for each (SIGKILL after 30 s)."""
    for r in replicas:
        if r.alive():
            assert r.proc is not None
            r.proc.send_signal(signal.SIGTERM)
    for r in replicas:
        r.stop()


def start_all(replicas: list[Replica]) -> None:
    """Start every replica, then wait until each is ready."""
    for r in replicas:
        r.start()
    for r in replicas:
        r.wait_ready()


class LaunchSide(Protocol):
    """Where the replicas launch, read from outside the brokers: ``env`` for each replica, ``data_dir``
    shared by them (``None``: one each), ``provider`` for the job specs."""

    provider: str
    env: dict[str, str]
    data_dir: Path | None
    launch_concurrency: int  # BROKER_SCHEDULER_LAUNCH_CONCURRENCY of the replicas

    def launched(self) -> int:
        """How many launches of broker jobs the engine holds now (ended ones included)."""
        ...

    def launches_per_job(self) -> Counter[str]:
        """Broker job id -> how many launches the engine holds for it."""
        ...


@dataclass
class EnvSide:
    """Replicas each with their own data directory, launching on what ``env`` sets (e.g.
    ``BROKER_PROVIDERS=onprem`` with an inventory): two "machines" sharing only the database."""

    env: dict[str, str]
    provider: str = "onprem"
    data_dir: Path | None = None
    launch_concurrency: int = 1


class SlurmSide:
    """A Slurm cluster (:func:`tests.providers.slurm_support.slurm_cluster`): provider ``slurm``."""

    provider = "slurm"
    data_dir = None
    launch_concurrency = 8  # sbatch/squeue commands at once: slurmctld serialises much of the rest

    def __init__(self, slurm_conf: Path, log_dir: Path, slurm_env: dict[str, str]) -> None:
        self.env = {"BROKER_PROVIDERS": "slurm", "BROKER_SLURM_CONF": str(slurm_conf),
                    "BROKER_SLURM_LOG_DIR": str(log_dir)}  # one host: the replicas share the runs' log dir
        self._slurm_env = slurm_env

    def _names(self) -> list[str]:
        out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%j"], env=self._slurm_env, capture_output=True,
                             text=True, check=True, timeout=60).stdout
        return [n for n in out.split() if n.startswith("hb-")]

    def launched(self) -> int:
        return len(self._names())

    def launches_per_job(self) -> Counter[str]:
        return Counter(n.removeprefix("hb-") for n in self._names())


SIMULATED_INVENTORY = """\
sites:
  - {name: rack-sim, continent: eu, uplink_gbps: 10}
hosts:
  - {name: sim-0, site: rack-sim, vcpus: 4096, memory_gib: 4096}
  - {name: sim-1, site: rack-sim, vcpus: 4096, memory_gib: 4096}
  - {name: sim-2, site: rack-sim, vcpus: 4096, memory_gib: 4096}
"""


class OnPremSide:
    """The on-prem pool over three simulated hosts, its runs in one data directory all replicas share."""

    provider = "onprem"
    launch_concurrency = 32  # a launch is mostly a wait for the disk (fsync): many overlap well

    def __init__(self, work: Path) -> None:
        inventory = work / "inventory.yaml"
        inventory.write_text(SIMULATED_INVENTORY)
        self.data_dir: Path | None = work / "shared-data"
        self.runs = self.data_dir / "runs"
        self.env = {"BROKER_PROVIDERS": "onprem", "BROKER_INVENTORY": str(inventory)}

    def launched(self) -> int:
        try:
            with os.scandir(self.runs) as it:
                return sum(1 for e in it if os.path.exists(os.path.join(e.path, "run.json")))
        except FileNotFoundError:
            return 0

    def launches_per_job(self) -> Counter[str]:
        import json

        return Counter(json.loads(p.read_text())["tags"]["hb-job"] for p in self.runs.glob("*/run.json"))


class Replica:
    """One ``broker serve`` subprocess on a free port (scheduler on), launching on ``side``; its data
    directory is the side's shared one, or its own."""

    def __init__(self, name: str, work: Path, database_url: str, side: LaunchSide, interval: float = 0.2,
                 launch_concurrency: int | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = side.data_dir or work / name
        self.log = work / f"{name}.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")} | {
            "BROKER_DATABASE_URL": database_url,
            "BROKER_ADMIN_TOKEN": ADMIN,
            "BROKER_SCHEDULER_INTERVAL_SECONDS": str(interval),
            "BROKER_SCHEDULER_LAUNCH_CONCURRENCY": str(launch_concurrency or side.launch_concurrency),
            "BROKER_LOG_LEVEL": "INFO",
        } | side.env
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: Any = None

    def start(self) -> None:
        self._out = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(SERVE + ["--port", str(self.port), "--data-dir", str(self.data)],
                                     env=self.env, stdout=self._out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready: {self.log.read_text()[-3000:]}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def leader_lines(self) -> int:
        try:
            return self.log.read_text(errors="replace").count(LEADER_LINE)
        except OSError:
            return 0

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._out is not None:
            self._out.close()
            self._out = None


@dataclass
class RunResult:
    jobs: int
    replicas: int
    states: Counter[str]
    running_transitions: Counter[int]  # how many jobs had 0, 1, 2... PROVISIONING -> RUNNING transitions
    launched_attempts: Counter[int]  # ... "launched" attempt rows
    adopted: int  # jobs RUNNING by "adopted after a restart" (launched by the killed leader, not recorded)
    launches_per_job: Counter[int]  # broker jobs with 0, 1, 2... launches on the engine (batch jobs, runs)
    doubles: list[str]  # broker jobs with more than one launch or RUNNING transition
    placed_again: int  # jobs placed more than once, each time after an undone placement (a takeover's)
    unexplained_placements: list[str]  # jobs placed more often than 1 + their undone placements
    submitted_by: dict[str, int]
    submit_seconds: float
    launch_seconds: float  # first submit -> every job launched (RUNNING or ended)
    total_seconds: float  # first submit -> every job ended
    killed: str | None = None
    in_flight_at_kill: int = 0  # launches the engine held that the store did not record as launched yet
    takeover_seconds: float | None = None
    new_leader: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def launched_per_second(self) -> float:
        return self.jobs / self.launch_seconds if self.launch_seconds else 0.0

    @property
    def accepted_per_second(self) -> float:
        return self.jobs / self.submit_seconds if self.submit_seconds else 0.0


def _submit(replica: Replica, docs: list[dict[str, Any]], batch: int, key: str, ids: list[str]) -> None:
    with httpx.Client(base_url=replica.url, headers=ADMIN_H, timeout=120) as http:
        for n in range(0, len(docs), batch):
            r = http.post("/v1/namespaces/default/jobs", json=docs[n:n + batch],
                          headers={"Idempotency-Key": f"{key}-{n}"})
            r.raise_for_status()
            ids.extend(j["id"] for j in r.json()["jobs"])


def _counts(engine: Any) -> Counter[str]:
    import sqlalchemy as sa

    with engine.connect() as conn:
        return Counter({s: int(n) for s, n in conn.execute(sa.text("SELECT state, count(*) FROM jobs GROUP BY state"))})


def _launched(engine: Any) -> int:
    counts = _counts(engine)
    return counts["RUNNING"] + counts["SUCCEEDED"] + counts["FAILED"]


def run(replicas: list[Replica], database_url: str, side: LaunchSide, *, jobs: int,
        kill_leader_at: float | None = None, batch: int = 250, timeout: float = 600.0) -> RunResult:
    """Submit ``jobs`` jobs (``true`` on 1 vCPU, on ``side.provider``) spread evenly over ``replicas``,
    SIGKILL the leader once the engine holds ``kill_leader_at`` of them *and* more than the store records
    as launched (so the kill lands mid-dispatch), wait until all ended; see the module docstring."""
    import sqlalchemy as sa

    engine = sa.create_engine(database_url, pool_pre_ping=True)
    docs = [job_doc(f"rep-{i}", cpu="1", memory="64Mi", command=["true"], providers=[side.provider],
                    retry={"backoffLimit": 3, "retryDelaySeconds": 1}) for i in range(jobs)]
    shares = [docs[i::len(replicas)] for i in range(len(replicas))]
    accepted: dict[str, list[str]] = {r.name: [] for r in replicas}
    result_notes: list[str] = []
    t0 = time.monotonic()
    threads = [threading.Thread(target=_submit, args=(r, share, batch, f"{r.name}-{secrets.token_hex(3)}",
                                                      accepted[r.name]))
               for r, share in zip(replicas, shares, strict=True)]
    for t in threads:
        t.start()
    killed: Replica | None = None
    in_flight = 0
    t_kill = takeover = None
    new_leader = None
    launch_done: float | None = None
    submit_done: float | None = None
    last_look = 0.0
    deadline = t0 + timeout
    while True:
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"jobs not done after {timeout:g} s: {_counts(engine)}")
        counts = _counts(engine)
        launched = counts["RUNNING"] + counts["SUCCEEDED"] + counts["FAILED"]
        if killed is None and kill_leader_at is not None and now - last_look >= 0.3:
            # Kill in the middle of a dispatch: the engine already holds more of our launches than the
            # store records as launched (the leader launched them and has not committed them yet).
            last_look = now
            on_engine = side.launched()
            leaders = [r for r in replicas if r.alive() and r.leader_lines()]
            if leaders and on_engine >= kill_leader_at * jobs and on_engine > _launched(engine):
                killed = leaders[0]
                in_flight = on_engine - _launched(engine)
                before = {r.name: r.leader_lines() for r in replicas}
                assert killed.proc is not None
                killed.proc.send_signal(signal.SIGKILL)
                t_kill = time.monotonic()
                killed.proc.wait(10)
        if killed is not None and takeover is None:
            for r in replicas:
                if r is not killed and r.leader_lines() > before[r.name]:
                    takeover, new_leader = time.monotonic() - (t_kill or 0.0), r.name
        if submit_done is None and not any(t.is_alive() for t in threads):
            submit_done = now
        if launch_done is None and launched >= jobs and submit_done is not None:
            launch_done = now
        if counts["SUCCEEDED"] + counts["FAILED"] + counts["CANCELLED"] >= jobs and not any(
                t.is_alive() for t in threads):
            break
        time.sleep(0.1)
    total = time.monotonic() - t0
    for t in threads:
        t.join()
    submit_seconds = (submit_done or time.monotonic()) - t0
    ids = [i for share in accepted.values() for i in share]
    with engine.connect() as conn:
        running = Counter(dict(conn.execute(sa.text(
            "SELECT job_id, count(*) FROM job_events WHERE to_state = 'RUNNING' AND from_state <> 'RUNNING' "
            "GROUP BY job_id")).all()))
        attempts = Counter(dict(conn.execute(sa.text(
            "SELECT job_id, count(*) FROM attempts WHERE outcome = 'launched' GROUP BY job_id")).all()))
        placed = Counter(dict(conn.execute(sa.text(
            "SELECT job_id, count(*) FROM job_events WHERE from_state = 'PENDING' AND to_state = 'PLACED' "
            "GROUP BY job_id")).all()))
        undone = Counter(dict(conn.execute(sa.text(  # a placement given back: re-placed, requeued, retried
            "SELECT job_id, count(*) FROM job_events WHERE from_state IN ('PLACED', 'PROVISIONING', 'RUNNING') "
            "AND to_state IN ('PENDING', 'BACKOFF') GROUP BY job_id")).all()))
        adopted = {r[0] for r in conn.execute(sa.text(
            "SELECT DISTINCT job_id FROM job_events WHERE reason LIKE 'adopted after a restart%'"))}
        states = _counts(engine)
    engine.dispose()
    per_job = side.launches_per_job()
    doubles = sorted({i for i in ids if per_job[i] > 1 or running[i] > 1})
    if killed is not None and takeover is None:
        result_notes.append("no other replica logged leadership after the kill")
    return RunResult(
        jobs=jobs, replicas=len(replicas), states=states,
        running_transitions=Counter(running[i] for i in ids),
        launched_attempts=Counter(attempts[i] for i in ids), adopted=len(adopted),
        launches_per_job=Counter(per_job[i] for i in ids), doubles=doubles,
        placed_again=sum(1 for i in ids if placed[i] > 1),
        unexplained_placements=sorted(i for i in ids if placed[i] != 1 + undone[i]),
        submitted_by={k: len(v) for k, v in accepted.items()},
        submit_seconds=submit_seconds, launch_seconds=(launch_done or time.monotonic()) - t0, total_seconds=total,
        killed=killed.name if killed else None, in_flight_at_kill=in_flight, takeover_seconds=takeover,
        new_leader=new_leader,
        notes=result_notes,
    )


def slurm_nodes(n: int = 3, cpus: int = 64) -> list[tuple[str, int, int, str]]:
    """``n`` simulated nodes of ``cpus`` CPUs (64 MB per CPU) in partition ``main``."""
    return [(f"r{i}", cpus, cpus * 64, "main") for i in range(n)]

