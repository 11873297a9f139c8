"""The Slurm pool against a real Slurm cluster (Debian ``slurm-wlm``) started by this module
(:func:`tests.providers.slurm_support.slurm_cluster`).

The cluster is one slurmctld and three slurmd on this host (``slurmd -N``, each on its own port, all on
127.0.0.1): partition ``main`` = nodes n1, n2 (4 CPUs, 4000 MB each), partition ``big`` = node g1 (8 CPUs).
It is shared by every test here (session fixture) and stopped by PID at the end. Skipped, with the
reason, only when the Slurm daemons are not installed (``.ci/run`` installs ``slurm-wlm``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.errors import AuthError, InvalidRequestError
from broker.model import Capacity, InstanceState, JobSpec, Offer, Request, SiteKind
from providers import registry
from providers.base import Provider
from providers.slurm import SlurmPool, decode_comment, encode_comment, parse_gres_gpus, slurm_state
from tests.providers.builders import wait_states
from tests.providers.slurm_support import Cluster, missing_tools, slurm_cluster

NODES = (("n1", 4, 4000, "main"), ("n2", 4, 4000, "main"), ("g1", 8, 8000, "big"))
ENDED = {InstanceState.SUCCEEDED, InstanceState.FAILED, InstanceState.TERMINATED}


@pytest.fixture(scope="session")
def slurm() -> Iterator[Cluster]:
    missing = missing_tools()
    if missing:
        pytest.skip(f"Slurm is not installed here ({', '.join(missing)} missing). To fix: apt-get install "
                    "slurm-wlm munge (.ci/run does)")
    with slurm_cluster(NODES) as cluster:
        yield cluster


@pytest.fixture
def pool(slurm: Cluster, tmp_path: Path) -> Iterator[SlurmPool]:
    p = SlurmPool(tmp_path / "data", conf=slurm.conf, offers_ttl_seconds=0.0, env={})
    yield p
    live = [i.id for i in p.instances() if i.state not in ENDED]
    if live:
        p.terminate(live, "test-cleanup")


def _offer(pool: SlurmPool, partition: str) -> Offer:
    return next(o for o in pool.offers() if o.instance_type.name == partition)



def _job(command: list[str], *, vcpus: float = 1, memory_gib: float = 0.25, **kw: Any) -> JobSpec:
    return JobSpec(name="j", request=Request(name="j", vcpus=vcpus, memory_gib=memory_gib),
                   command=tuple(command), **kw)



# -- pure helpers ------------------------------------------------------------------------------------------

def test_states_gres_and_comments_are_parsed() -> None:
    assert slurm_state("CANCELLED by 0") is InstanceState.TERMINATED
    assert slurm_state("COMPLETED") is InstanceState.SUCCEEDED
    assert slurm_state("OUT_OF_MEMORY") is InstanceState.FAILED
    assert slurm_state("PENDING") is InstanceState.PENDING
    assert parse_gres_gpus("gpu:a100:4(S:0-1)") == (4, "a100")
    assert parse_gres_gpus("(null)") == (0, None)
    tags = {"hb-job": "j 1,x", "hb-request": "r=1|2"}
    text = encode_comment(tags)
    assert " " not in text and "|" not in text and decode_comment(text) == tags


# -- the real cluster --------------------------------------------------------------------------------------

def test_partitions_are_pools_with_capacity_from_sinfo(slurm: Cluster, tmp_path: Path) -> None:
    pool = registry.create("slurm", data_dir=tmp_path, env={"BROKER_SLURM_CONF": str(slurm.conf),
                                                            "BROKER_SLURM_SITE": "dc1"})
    assert isinstance(pool, Provider)
    offers = {o.instance_type.name: o for o in pool.offers()}
    assert sorted(offers) == ["big", "main"]
    main = offers["main"]
    assert (main.instance_type.vcpus, round(main.instance_type.memory_gib, 2)) == (4.0, 3.91)
    assert offers["big"].instance_type.vcpus == 8.0
    assert main.location.site is SiteKind.ONPREM and main.location.region == "dc1"
    assert main.capacity is Capacity.OWNED
    free = pool.free()
    assert (free["main"]["nodes"], free["main"]["vcpus"], free["big"]["nodes"]) == (2.0, 8.0, 1.0)
    only_big = SlurmPool(tmp_path, conf=slurm.conf, partitions=["big"], env={})
    assert [o.instance_type.name for o in only_big.offers()] == ["big"]


def test_a_drained_partition_is_no_longer_offered(slurm: Cluster, pool: SlurmPool) -> None:
    slurm.cli("scontrol", "update", "nodename=g1", "state=drain", "reason=hb-test")
    try:
        assert [o.instance_type.name for o in pool.offers()] == ["main"]
    finally:
        slurm.cli("scontrol", "update", "nodename=g1", "state=resume")
    deadline = time.monotonic() + 10
    while len(pool.offers()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sorted(o.instance_type.name for o in pool.offers()) == ["big", "main"], slurm.cli("sinfo", "-N")


def test_a_run_reports_its_exit_code_and_logs_and_carries_the_job_id(slurm: Cluster, pool: SlurmPool) -> None:
    job = _job(["sh", "-c", 'echo "out $HB_JOB $GREETING $SLURMD_NODENAME"; echo oops >&2; exit 3'],
               env={"GREETING": "hello"})
    pool.launch(_offer(pool, "main"), 1, "req-fail", tags={"hb-job": "job-fail", "hb-namespace": "ns1"}, job=job)
    ok = pool.launch(_offer(pool, "big"), 1, "req-ok", tags={"hb-job": "job-ok"}, job=_job(["true"]))
    (failed,) = wait_states(pool, "req-fail", ENDED)
    (done,) = wait_states(pool, "req-ok", ENDED)
    assert (failed.state, failed.exit_code, failed.instance_type) == (InstanceState.FAILED, 3, "main")
    assert (done.state, done.exit_code, done.id) == (InstanceState.SUCCEEDED, 0, ok[0].id)
    out, err = pool.logs(failed.id)
    assert out.read_text().startswith("out job-fail hello n")
    assert err.read_text() == "oops\n"
    # Slurm itself carries the broker's job id: the job name and the comment (squeue %j, %k).
    sid = failed.id.removeprefix("slurm-")
    name, comment = slurm.cli("squeue", "-h", "-t", "all", "-j", sid, "-o", "%j|%k").strip().split("|")
    assert name == "hb-job-fail"
    assert decode_comment(comment) == {"hb-job": "job-fail", "hb-namespace": "ns1", "hb-request": "req-fail",
                                       "hb-node": "0"}
    assert "JobState=FAILED" in slurm.cli("scontrol", "-o", "show", "job", sid)
    assert failed.tags["hb-namespace"] == "ns1"


def test_a_relaunch_with_the_same_request_id_submits_no_second_job(slurm: Cluster, pool: SlurmPool,
                                                                   tmp_path: Path) -> None:
    job = _job(["sleep", "30"])
    first = pool.launch(_offer(pool, "main"), 1, "req-idem", tags={"hb-job": "job-idem"}, job=job)
    again = pool.launch(_offer(pool, "main"), 1, "req-idem", tags={"hb-job": "job-idem"}, job=job)
    # A broker that lost its records (crash between sbatch and the record): squeue's name + comment find it.
    amnesiac = SlurmPool(tmp_path / "other-data", conf=slurm.conf, env={})
    third = amnesiac.launch(_offer(amnesiac, "main"), 1, "req-idem", tags={"hb-job": "job-idem"}, job=job)
    assert [i.id for i in first] == [i.id for i in again] == [i.id for i in third]
    listed = slurm.cli("squeue", "-h", "-t", "all", "--name", "hb-job-idem", "-o", "%i").split()
    assert listed == [first[0].id.removeprefix("slurm-")]
    # A new request id of the same job (a retry) is a new batch job.
    retry = pool.launch(_offer(pool, "main"), 1, "req-idem-r1", tags={"hb-job": "job-idem"}, job=job)
    assert retry[0].id != first[0].id
    pool.terminate([first[0].id, retry[0].id], "cleanup")


def test_terminate_cancels_the_batch_job_and_is_idempotent(slurm: Cluster, pool: SlurmPool) -> None:
    (inst,) = pool.launch(_offer(pool, "main"), 1, "req-cancel", tags={"hb-job": "job-cancel"},
                          job=_job(["sleep", "60"]))
    wait_states(pool, "req-cancel", {InstanceState.RUNNING})
    pool.terminate([inst.id], "req-cancel:done")
    (gone,) = wait_states(pool, "req-cancel", ENDED)
    assert gone.state is InstanceState.TERMINATED
    sid = inst.id.removeprefix("slurm-")
    assert slurm.cli("squeue", "-h", "-t", "all", "-j", sid, "-o", "%T").strip() == "CANCELLED"
    pool.terminate([inst.id, "slurm-999999", "not-ours"], "again")  # no error: ended and unknown ids are ignored


def test_a_gang_gets_one_batch_job_per_node_on_distinct_nodes(pool: SlurmPool) -> None:
    job = _job(["sh", "-c", "echo $SLURMD_NODENAME $HB_NODE"], vcpus=4)
    insts = pool.launch(_offer(pool, "main"), 2, "req-gang", tags={"hb-job": "job-gang"}, job=job)
    assert len({i.id for i in insts}) == 2
    done = wait_states(pool, "req-gang", ENDED)
    assert {i.state for i in done} == {InstanceState.SUCCEEDED}
    lines = sorted(pool.logs(i.id)[0].read_text().split()[0] for i in done)
    assert lines == ["n1", "n2"]  # 4 CPUs each: one per node of the partition


def test_refusals_are_classified(slurm: Cluster, pool: SlurmPool, tmp_path: Path) -> None:
    offer = _offer(pool, "main")
    bogus = Offer(instance_type=type(offer.instance_type)(name="nope", vcpus=1, memory_gib=1),
                  location=offer.location, capacity=offer.capacity, hourly_usd=0.0)
    with pytest.raises(InvalidRequestError, match="sbatch failed"):
        pool.launch(bogus, 1, "req-bad", tags={"hb-job": "job-bad"}, job=_job(["true"]))
    with pytest.raises(InvalidRequestError, match="needs the job's command"):
        pool.launch(offer, 1, "req-nocmd", tags={"hb-job": "job-nocmd"}, job=_job([]))
    no_clients = SlurmPool(tmp_path / "x", conf=slurm.conf, bin_dir=tmp_path / "empty", env={})
    with pytest.raises(AuthError, match="BROKER_SLURM_BIN_DIR"):
        no_clients.offers()


def test_the_broker_runs_a_job_on_slurm_end_to_end(slurm: Cluster, tmp_path: Path) -> None:
    """A job submitted to the broker is placed on a Slurm partition, runs there, and ends with its exit code."""
    from broker.model import JobState
    from tests.broker.service_support import job_doc, make_app
    from tests.broker.test_service_scheduler import NS

    pool = SlurmPool(tmp_path / "data", conf=slurm.conf, offers_ttl_seconds=0.0, env={})
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'broker.db'}", providers={"slurm": pool})
    hb = app.state.hb
    from broker.lifecycle import submit_jobs
    from broker.spec import parse_job_spec
    from broker.store import JobRow

    docs = [job_doc("ok", command=["sh", "-c", "echo fine"], providers=["slurm"]),
            job_doc("bad", command=["sh", "-c", "exit 7"], providers=["slurm"], retry={"backoffLimit": 0})]
    specs = [parse_job_spec(d, now=hb.clock.now()) for d in docs]
    with hb.store.tx() as session:
        ids = [j["id"] for j in submit_jobs(session, NS, specs, now=hb.clock.now(),
                                            spec_docs=[json.dumps(s.raw) for s in specs])]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            hb.scheduler.run_cycle()
            with hb.store.read() as session:
                rows = {i: session.get(JobRow, i) for i in ids}
            if all(r is not None and r.state in ("SUCCEEDED", "FAILED") for r in rows.values()):
                break
            time.sleep(0.1)
        ok, bad = rows[ids[0]], rows[ids[1]]
        assert ok is not None and bad is not None
        assert (ok.state, ok.provider, ok.exit_code) == (JobState.SUCCEEDED.value, "slurm", 0)
        assert (bad.state, bad.exit_code) == (JobState.FAILED.value, 7)
        (inst,) = json.loads(ok.instances_json or "[]")
        assert pool.logs(inst["id"])[0].read_text() == "fine\n"
        from broker.api import job_detail

        with hb.store.read() as session:
            events = job_detail(session, ok)["events"]
        placed = next(e for e in events if e["to"] == "PLACED")
        assert placed["reason"] in ("on-prem pool slurm:main", "on-prem pool slurm:big")
        assert placed["data"]["provider"] == "slurm"
        # The offers the API lists include the Slurm partitions as on-prem offers.
        offers, _ = hb.offers_matching("slurm", None, 0, 0, 0, 10)
        assert sorted(o.instance_type.name for o in offers) == ["big", "main"]
    finally:
        hb.store.dispose()


def test_another_process_lists_and_adopts_runs_it_did_not_launch(slurm: Cluster, tmp_path: Path) -> None:
    """What a new scheduler leader sees at reconciliation: batch jobs another broker process submitted,
    found by name and comment, with their tags, state, exit code and (shared log dir) logs."""
    logs = tmp_path / "shared-runs"
    first = SlurmPool(tmp_path / "a", conf=slurm.conf, log_dir=logs, env={})
    (inst,) = first.launch(_offer(first, "main"), 1, "req-adopt", tags={"hb-job": "job-adopt"},
                           job=_job(["sh", "-c", "echo adopted; exit 2"]))
    second = SlurmPool(tmp_path / "b", conf=slurm.conf, log_dir=logs, env={})
    (seen,) = wait_states(second, "req-adopt", ENDED)
    assert (seen.id, seen.state, seen.exit_code) == (inst.id, InstanceState.FAILED, 2)
    assert seen.tags["hb-job"] == "job-adopt"
    assert second.logs(seen.id)[0].read_text() == "adopted\n"
    # and a relaunch of that request id through the second process submits nothing
    again = second.launch(_offer(second, "main"), 1, "req-adopt", tags={"hb-job": "job-adopt"}, job=_job(["true"]))
    assert [i.id for i in again] == [inst.id]
