"""The Ray pool against a real Ray head (``ray start --head --block``) started by this module.

Every listener of the head is on 127.0.0.1: ``--node-ip-address 127.0.0.1`` alone is not enough on Linux
(Ray swaps a loopback address for the host's "remotely reachable" one), so the head runs with
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which keeps the node IP, and so every bind, on the loopback address.
The head is shared by every test here (session fixture, 4 CPUs) and stopped by killing the process group
it was started in. Skipped, with the reason, only when the ``ray`` package is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.errors import InvalidRequestError, TransientError
from broker.model import Capacity, InstanceState, JobSpec, Request, SiteKind
from providers import registry
from providers.base import Provider
from tests.broker.service_support import free_port
from tests.providers.builders import wait_states

ENDED = {InstanceState.SUCCEEDED, InstanceState.FAILED, InstanceState.TERMINATED}


def _ray_cli() -> str | None:
    exe = Path(sys.executable).with_name("ray")
    return str(exe) if exe.exists() else shutil.which("ray")


@pytest.fixture(scope="session")
def ray_head() -> Iterator[str]:
    pytest.importorskip("ray.job_submission", reason="the ray package is not installed. To fix: pip install "
                        "'hybrid-broker[ray]' (the dev extra has it)")
    cli = _ray_cli()
    if cli is None:
        pytest.skip("the ray CLI is not installed. To fix: pip install 'ray[default]'")
    temp = Path(tempfile.mkdtemp(prefix="hb-ray-"))
    gcs, dash, client, agent, metrics = (free_port() for _ in range(5))
    low = 30000 + (os.getpid() % 200) * 100
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    log = open(temp / "head.log", "wb")  # noqa: SIM115 - closed in the finalizer
    proc = subprocess.Popen(
        [cli, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--include-dashboard", "true",
         "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
         "--metrics-export-port", str(metrics), "--min-worker-port", str(low), "--max-worker-port", str(low + 99),
         "--num-cpus", "4", "--num-gpus", "0", "--disable-usage-stats", "--temp-dir", str(temp)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    address = f"http://127.0.0.1:{dash}"
    try:
        import httpx

        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited: {(temp / 'head.log').read_text()[-2000:]}")
            try:
                nodes = httpx.get(f"{address}/api/v0/nodes", timeout=2)
                if nodes.status_code == 200 and any(n.get("state") == "ALIVE" for n in
                                                    nodes.json()["data"]["result"]["result"]):
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the Ray dashboard did not answer within 60 s")
            time.sleep(0.25)
        yield address
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        # ray start --block stops the processes it started on SIGTERM; anything of the group left goes now.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def pool(ray_head: str) -> Iterator[Any]:
    from providers.ray_engine import RayPool

    p = RayPool(address=ray_head, offers_ttl_seconds=0.0, env={})
    yield p
    live = [i.id for i in p.instances() if i.state not in ENDED]
    if live:
        p.terminate(live, "test-cleanup")



def _job(command: list[str], *, vcpus: float = 1, **kw: Any) -> JobSpec:
    return JobSpec(name="j", request=Request(name="j", vcpus=vcpus, memory_gib=0.0), command=tuple(command), **kw)



def test_states_and_submission_ids() -> None:
    from providers.ray_engine import ray_state, submission_id

    assert ray_state("STOPPED") is InstanceState.TERMINATED
    assert ray_state("FAILED") is InstanceState.FAILED
    assert submission_id("r1", 0) == submission_id("r1", 0) != submission_id("r1", 1)
    assert submission_id("r1", 0).startswith("hb-")


def test_the_cluster_is_one_on_prem_offer_shaped_like_its_node(ray_head: str) -> None:
    pool = registry.create("ray", data_dir=None, env={"BROKER_RAY_ADDRESS": ray_head, "BROKER_RAY_POOL": "py",
                                                      "BROKER_RAY_SITE": "dc1"})
    assert isinstance(pool, Provider)
    (offer,) = pool.offers()
    assert (offer.instance_type.name, offer.instance_type.vcpus, offer.instance_type.gpus) == ("py", 4.0, 0)
    assert offer.instance_type.memory_gib > 0
    assert (offer.location.provider, offer.location.region, offer.location.site) == ("ray", "dc1", SiteKind.ONPREM)
    assert offer.capacity is Capacity.OWNED
    assert pool.free()["py"]["nodes"] == 1.0


def test_runs_report_exit_codes_logs_and_tags(pool: Any) -> None:
    (offer,) = pool.offers()
    bad = pool.launch(offer, 1, "ray-req-fail", tags={"hb-job": "job-r1", "hb-namespace": "ns1"},
                      job=_job(["sh", "-c", 'echo "out $HB_JOB $GREETING"; exit 4'], env={"GREETING": "hi"}))
    good = pool.launch(offer, 1, "ray-req-ok", tags={"hb-job": "job-r2"},
                       job=_job([sys.executable, "-c", "import ray; print('py', ray.__version__ > '2')"]))
    (failed,) = wait_states(pool, "ray-req-fail", ENDED, seconds=60)
    (done,) = wait_states(pool, "ray-req-ok", ENDED, seconds=60)
    assert (failed.state, failed.exit_code, failed.id) == (InstanceState.FAILED, 4, bad[0].id)
    assert (done.state, done.exit_code, done.id) == (InstanceState.SUCCEEDED, 0, good[0].id)
    assert "out job-r1 hi" in pool.logs(failed.id)
    assert "py True" in pool.logs(done.id)
    assert failed.tags == {"hb-job": "job-r1", "hb-namespace": "ns1", "hb-request": "ray-req-fail", "hb-node": "0"}
    assert pool.poll_errors() == []  # an exit code is the job's failure, not the cluster's


def test_a_relaunch_with_the_same_request_id_submits_no_second_job_and_terminate_stops_it(
        pool: Any, ray_head: str) -> None:
    from ray.job_submission import JobSubmissionClient

    from providers.ray_engine import RayPool

    (offer,) = pool.offers()
    job = _job(["sleep", "60"])
    first = pool.launch(offer, 2, "ray-req-idem", tags={"hb-job": "job-idem"}, job=job)
    again = pool.launch(offer, 2, "ray-req-idem", tags={"hb-job": "job-idem"}, job=job)
    other = RayPool(address=ray_head, env={}).launch(offer, 2, "ray-req-idem", tags={"hb-job": "job-idem"}, job=job)
    assert [i.id for i in first] == [i.id for i in again] == [i.id for i in other]
    assert len({i.id for i in first}) == 2
    listed = [j for j in JobSubmissionClient(ray_head).list_jobs() if (j.metadata or {}).get("hb-job") == "job-idem"]
    assert len(listed) == 2
    # Terminate: a running job is stopped (terminated); ended and unknown ids are ignored.
    wait_states(pool, "ray-req-idem", {InstanceState.RUNNING}, seconds=60)
    pool.terminate([i.id for i in first], "ray-req-idem:done")
    gone = wait_states(pool, "ray-req-idem", ENDED, seconds=30)
    assert {i.state for i in gone} == {InstanceState.TERMINATED}
    pool.terminate([first[0].id, "hb-never-submitted-0"], "again")


def test_refusals_are_classified(pool: Any, tmp_path: Path) -> None:
    from providers.ray_engine import RayPool

    (offer,) = pool.offers()
    with pytest.raises(InvalidRequestError, match="needs the job's command"):
        pool.launch(offer, 1, "ray-req-nocmd", tags={"hb-job": "x"}, job=_job([]))
    nobody = RayPool(address=f"http://127.0.0.1:{free_port()}", env={})
    with pytest.raises(TransientError, match="does not answer|failed"):
        nobody.offers()


def test_the_broker_runs_a_job_on_ray_end_to_end(pool: Any, tmp_path: Path) -> None:
    """A job submitted to the broker is placed on the Ray pool, runs there, and ends with its exit code."""
    from broker.lifecycle import submit_jobs
    from broker.spec import parse_job_spec
    from broker.store import JobRow
    from tests.broker.service_support import job_doc, make_app

    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'broker.db'}", providers={"ray": pool})
    hb = app.state.hb
    docs = [job_doc("ok", command=["sh", "-c", "echo ray-fine"], providers=["ray"]),
            job_doc("bad", command=["sh", "-c", "exit 5"], providers=["ray"], retry={"backoffLimit": 0})]
    specs = [parse_job_spec(d, now=hb.clock.now()) for d in docs]
    with hb.store.tx() as session:
        ids = [j["id"] for j in submit_jobs(session, "default", specs, now=hb.clock.now(),
                                            spec_docs=[json.dumps(s.raw) for s in specs])]
    try:
        deadline = time.monotonic() + 60
        rows: dict[str, Any] = {}
        while time.monotonic() < deadline:
            hb.scheduler.run_cycle()
            with hb.store.read() as session:
                rows = {i: session.get(JobRow, i) for i in ids}
            if all(r is not None and r.state in ("SUCCEEDED", "FAILED") for r in rows.values()):
                break
            time.sleep(0.2)
        ok, bad = rows[ids[0]], rows[ids[1]]
        assert (ok.state, ok.provider, ok.exit_code) == ("SUCCEEDED", "ray", 0)
        assert (bad.state, bad.exit_code) == ("FAILED", 5)
        (inst,) = json.loads(ok.instances_json or "[]")
        assert "ray-fine" in pool.logs(inst["id"])
        offers, _ = hb.offers_matching("ray", None, 0, 0, 0, 10)
        assert [o.instance_type.name for o in offers] == ["ray"]
    finally:
        hb.store.dispose()

