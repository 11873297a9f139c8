"""Several real ``broker serve`` replicas on one PostgreSQL database, launching on a real Slurm cluster.

Used by ``tests/broker/test_replicas.py`` (a bounded run) and ``bench/replicas.py`` (10,000 jobs, 1 vs 3
replicas). :func:`run` submits jobs spread over every replica, optionally SIGKILLs the scheduler leader once
a share of the jobs was launched, waits for every job to end and returns what the store and Slurm say:
states, RUNNING transitions, launched attempts and adoptions per job, Slurm batch jobs per broker job,
the leadership takeover time and the jobs/s figures.

Why Slurm and not the dry-run provider: a dry-run provider keeps its instances in the memory of the
process that launched them, so a new leader cannot see them and must relaunch them; Slurm keeps the
state outside every broker process, as a real engine does, which is what "launched exactly once across a
failover" is about.
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
from typing import Any

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


class Replica:
    """One ``broker serve`` subprocess on a free port (scheduler on), data directory ``work/name``: provider
    ``slurm`` when ``slurm_conf`` is given, else what ``env`` sets (e.g. ``BROKER_PROVIDERS=onprem``)."""

    def __init__(self, name: str, work: Path, database_url: str, slurm_conf: Path | None = None,
                 log_dir: Path | None = None, interval: float = 0.2, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = work / name
        self.log = work / f"{name}.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")} | {
            "BROKER_DATABASE_URL": database_url,
            "BROKER_ADMIN_TOKEN": ADMIN,
            "BROKER_SCHEDULER_INTERVAL_SECONDS": str(interval),
            "BROKER_LOG_LEVEL": "INFO",
        }
        if slurm_conf is not None:
            self.env |= {
                "BROKER_PROVIDERS": "slurm",
                "BROKER_SLURM_CONF": str(slurm_conf),
                "BROKER_SLURM_LOG_DIR": str(log_dir),  # one host: the replicas share the runs' log dir
            }
        self.env |= env or {}
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
    slurm_jobs_per_job: Counter[int]  # broker jobs with 0, 1, 2... Slurm batch jobs named after them
    doubles: list[str]  # broker jobs with more than one Slurm batch job or RUNNING transition
    submitted_by: dict[str, int]
    submit_seconds: float
    launch_seconds: float  # first submit -> every job launched (RUNNING or ended)
    total_seconds: float  # first submit -> every job ended
    killed: str | None = None
    in_flight_at_kill: int = 0  # batch jobs in Slurm that the store did not record as launched yet
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


def _slurm_job_count(slurm_env: dict[str, str]) -> int:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%j"], env=slurm_env, capture_output=True, text=True,
                         timeout=60).stdout
    return sum(1 for n in out.split() if n.startswith("hb-"))


def run(replicas: list[Replica], database_url: str, slurm_env: dict[str, str], *, jobs: int,
        kill_leader_at: float | None = None, batch: int = 250, timeout: float = 600.0) -> RunResult:
    """Submit ``jobs`` jobs (``true`` on 1 vCPU, Slurm partition ``main``) spread evenly over ``replicas``,
    SIGKILL the leader once Slurm holds ``kill_leader_at`` of them *and* more than the store records as
    launched (so the kill lands mid-dispatch), wait until all ended; see the module docstring."""
    import sqlalchemy as sa

    engine = sa.create_engine(database_url, pool_pre_ping=True)
    docs = [job_doc(f"rep-{i}", cpu="1", memory="64Mi", command=["true"], providers=["slurm"],
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
            # Kill in the middle of a dispatch: Slurm already holds more of our batch jobs than the store
            # records as launched (the leader submitted them and has not committed them yet).
            last_look = now
            in_slurm = _slurm_job_count(slurm_env)
            leaders = [r for r in replicas if r.alive() and r.leader_lines()]
            if leaders and in_slurm >= kill_leader_at * jobs and in_slurm > _launched(engine):
                killed = leaders[0]
                in_flight = in_slurm - _launched(engine)
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
        adopted = {r[0] for r in conn.execute(sa.text(
            "SELECT DISTINCT job_id FROM job_events WHERE reason LIKE 'adopted after a restart%'"))}
        states = _counts(engine)
    engine.dispose()
    names = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%j"], env=slurm_env, capture_output=True,
                           text=True, check=True, timeout=60).stdout.split()
    per_job = Counter(n.removeprefix("hb-") for n in names if n.startswith("hb-"))
    doubles = sorted({i for i in ids if per_job[i] > 1 or running[i] > 1})
    if killed is not None and takeover is None:
        result_notes.append("no other replica logged leadership after the kill")
    return RunResult(
        jobs=jobs, replicas=len(replicas), states=states,
        running_transitions=Counter(running[i] for i in ids),
        launched_attempts=Counter(attempts[i] for i in ids), adopted=len(adopted),
        slurm_jobs_per_job=Counter(per_job[i] for i in ids), doubles=doubles,
        submitted_by={k: len(v) for k, v in accepted.items()},
        submit_seconds=submit_seconds, launch_seconds=(launch_done or time.monotonic()) - t0, total_seconds=total,
        killed=killed.name if killed else None, in_flight_at_kill=in_flight, takeover_seconds=takeover,
        new_leader=new_leader,
        notes=result_notes,
    )


def slurm_nodes(n: int = 3, cpus: int = 64) -> list[tuple[str, int, int, str]]:
    """``n`` simulated nodes of ``cpus`` CPUs (64 MB per CPU) in partition ``main``."""
    return [(f"r{i}", cpus, cpus * 64, "main") for i in range(n)]

