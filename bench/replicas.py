"""Replicas: N jobs through 1 and through 3 ``broker serve`` processes on one PostgreSQL database, the leader
SIGKILLed mid-dispatch in runs with more than one replica. Launch side ``onprem`` (the on-prem pool's
simulated hosts, runs as files in the shared data directory: the broker's own speed) or ``slurm`` (a real
Slurm cluster, 3 simulated nodes x 64 CPUs, started here: the engine's speed). Prints one line per run:
jobs/s accepted by the API, jobs/s placed and launched (first submit -> every job RUNNING or ended), total
seconds, takeover seconds, and the exactly-once checks (one launch on the engine, one RUNNING transition
and one launched attempt or adoption per job).

    .venv/bin/python bench/replicas.py [--side onprem|slurm] [--jobs 10000] [--replicas 1,3] [--kill-at 0.4]
                                       [--concurrency 8] [--json]

Needs PostgreSQL on 127.0.0.1:5432 (trust auth); ``--side slurm`` needs slurm-wlm + munge (``.ci/run``
installs them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.broker.replica_support import (  # noqa: E402
    LaunchSide,
    OnPremSide,
    Replica,
    SlurmSide,
    pg_database,
    prepare_database,
    run,
    slurm_nodes,
    start_all,
    stop_all,
)
from tests.providers.slurm_support import missing_tools, slurm_cluster  # noqa: E402


@contextlib.contextmanager
def launch_side(name: str, work: Path) -> Iterator[LaunchSide]:
    if name == "onprem":
        yield OnPremSide(work)
        return
    if missing_tools():
        sys.exit(f"Slurm is not installed ({', '.join(missing_tools())}). To fix: apt-get install slurm-wlm munge")
    with slurm_cluster(slurm_nodes(3, 64), def_mem_per_cpu=64, min_job_age=7200) as cluster:
        yield SlurmSide(cluster.conf, work / "slurm-runs", cluster.env())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=("onprem", "slurm"), default="onprem")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--replicas", default="1,3", help="comma list of replica counts, one run each")
    parser.add_argument("--kill-at", type=float, default=0.4,
                        help="SIGKILL the leader once this share of the jobs was launched (runs with >1 replica)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="BROKER_SCHEDULER_LAUNCH_CONCURRENCY (default: 32 on-prem, 8 Slurm)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for count in (int(x) for x in args.replicas.split(",")):
        with tempfile.TemporaryDirectory() as tmp, pg_database() as url, launch_side(args.side, Path(tmp)) as side:
            if url is None:
                sys.exit("PostgreSQL is not reachable at 127.0.0.1:5432")
            work = Path(tmp)
            prepare_database(url)
            reps = [Replica(f"replica-{i}", work, url, side, launch_concurrency=args.concurrency)
                    for i in range(count)]
            try:
                start_all(reps)
                res = run(reps, url, side, jobs=args.jobs, batch=500, timeout=7200,
                          kill_leader_at=args.kill_at if count > 1 else None)
            finally:
                stop_all(reps)
            concurrency = reps[0].env["BROKER_SCHEDULER_LAUNCH_CONCURRENCY"]
        once = not res.doubles and not res.unexplained_placements and res.launches_per_job == {1: res.jobs} and \
            res.running_transitions == {1: res.jobs} and res.launched_attempts[1] + res.adopted == res.jobs
        row = {
            "side": args.side, "replicas": count, "jobs": res.jobs, "concurrency": int(concurrency),
            "accepted_jobs_per_s": round(res.accepted_per_second, 1),
            "launched_jobs_per_s": round(res.launched_per_second, 1), "total_s": round(res.total_seconds, 1),
            "killed": res.killed, "in_flight_at_kill": res.in_flight_at_kill,
            "takeover_s": None if res.takeover_seconds is None else round(res.takeover_seconds, 2),
            "states": dict(res.states), "adopted": res.adopted, "placed_again": res.placed_again,
            "exactly_once": once, "doubles": res.doubles[:20],
            "submitted_by": res.submitted_by,
        }
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(f"{args.side}: replicas={count} jobs={res.jobs} concurrency={concurrency}: accepted "
                  f"{row['accepted_jobs_per_s']} jobs/s, launched {row['launched_jobs_per_s']} jobs/s, all ended "
                  f"in {row['total_s']} s; leader killed: {res.killed or '-'} ({res.in_flight_at_kill} launches "
                  f"in flight; takeover {row['takeover_s']} s); states {row['states']}; adopted {res.adopted}; "
                  f"exactly once: {once}{'' if once else ' doubles ' + str(res.doubles[:20])}", flush=True)


if __name__ == "__main__":
    main()
