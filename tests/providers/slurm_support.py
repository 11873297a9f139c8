"""A throwaway Slurm cluster (Debian ``slurm-wlm``) for the tests: one slurmctld, one slurmd per node (all on
this host, ``slurmd -N``, each on its own free port on 127.0.0.1) and a private munged, in a temp dir.

Not a pytest temp dir: those are 0700, and munged wants every parent dir of its socket to be o+x.
Everything started is stopped by PID when the context exits.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.broker.service_support import free_port

# name, CPUs, RealMemory (MB), partition
Node = tuple[str, int, int, str]
TOOLS = ("slurmctld", "slurmd", "sbatch", "squeue", "munged", "mungekey")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


@dataclass
class Cluster:
    dir: Path
    conf: Path
    nodes: Sequence[Node]

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def cli(self, *args: str) -> str:
        return subprocess.run(args, env=self.env(), capture_output=True, text=True, check=True, timeout=30).stdout


def _conf(d: Path, nodes: Sequence[Node], ctld_port: int, node_ports: list[int], def_mem_per_cpu: int,
          min_job_age: int) -> str:
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "nobody")
    lines = [
        "ClusterName=hbtest", "SlurmctldHost=localhost", f"SlurmctldPort={ctld_port}", f"SlurmUser={user}",
        "AuthType=auth/munge", f"AuthInfo=socket={d}/munge/munge.sock",
        "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
        f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool/%n", f"SlurmctldPidFile={d}/slurmctld.pid",
        f"SlurmdPidFile={d}/slurmd-%n.pid", f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log", "SlurmdParameters=config_overrides", "SlurmdTimeout=10",
        "ReturnToService=2", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory", f"DefMemPerCPU={def_mem_per_cpu}",
        "SchedulerType=sched/backfill", "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
        f"MinJobAge={min_job_age}", "MaxJobCount=50000", "MpiDefault=none", "MailProg=/bin/true",
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
    ]
    for (name, cpus, mem, _), port in zip(nodes, node_ports, strict=True):
        lines.append(f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
                     f"RealMemory={mem} State=UNKNOWN")
    for i, part in enumerate(dict.fromkeys(p for *_, p in nodes)):
        members = ",".join(n for n, *_, p in nodes if p == part)
        lines.append(f"PartitionName={part} Nodes={members} Default={'YES' if i == 0 else 'NO'} "
                     "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


@contextmanager
def slurm_cluster(nodes: Sequence[Node], *, def_mem_per_cpu: int = 256, min_job_age: int = 300) -> Iterator[Cluster]:
    """Start the cluster, wait until every node is idle, yield it; stop everything by PID afterwards.
    Ended jobs stay in ``squeue -t all`` for ``min_job_age`` seconds (Slurm's ``MinJobAge``)."""
    d = Path(tempfile.mkdtemp(prefix="hb-slurm-"))
    os.chmod(d, 0o755)
    for sub in ("state", "log", "munge", *(f"spool/{n}" for n, *_ in nodes)):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d / "munge", 0o711)  # munged: the socket dir must be o+x and not group/other writable
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    pid_file = d / "munge" / "munged.pid"
    try:
        subprocess.run(["mungekey", "--create", f"--keyfile={d}/munge/munge.key"], check=True, capture_output=True)
        subprocess.run(["munged", f"--key-file={d}/munge/munge.key", f"--socket={d}/munge/munge.sock",
                        f"--pid-file={pid_file}", f"--log-file={d}/munge/munged.log",
                        f"--seed-file={d}/munge/munged.seed"], check=True, capture_output=True)
        conf = d / "slurm.conf"
        conf.write_text(_conf(d, nodes, free_port(), [free_port() for _ in nodes], def_mem_per_cpu, min_job_age))
        cluster = Cluster(d, conf, nodes)
        out = open(d / "log" / "slurmctld.out", "wb")  # noqa: SIM115 - closed below
        logs.append(out)
        procs.append(subprocess.Popen(["slurmctld", "-D", "-f", str(conf)], env=cluster.env(), stdout=out,
                                      stderr=subprocess.STDOUT))
        for name, *_ in nodes:
            out = open(d / "log" / f"slurmd-{name}.out", "wb")  # noqa: SIM115
            logs.append(out)
            procs.append(subprocess.Popen(["slurmd", "-D", "-N", name, "-f", str(conf)], env=cluster.env(),
                                          stdout=out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        while True:
            got = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=cluster.env(), capture_output=True,
                                 text=True)
            if got.stdout.split()[1::2].count("idle") == len(nodes):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm nodes not idle after 30 s: {got.stdout} {got.stderr}")
            time.sleep(0.1)
        yield cluster
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for f in logs:
            f.close()
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
                deadline = time.monotonic() + 5  # it writes its seed file on the way out
                while time.monotonic() < deadline and pid_file.exists():
                    time.sleep(0.05)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(d, ignore_errors=True)
