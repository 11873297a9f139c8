"""The on-prem pool runs the job's command for real, tracks capacity, cancels, and survives a restart."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.clock import ManualClock
from broker.errors import CapacityError, InvalidRequestError
from broker.model import Capacity, InstanceState, InstanceType, Location, Offer, SiteKind
from providers.base import TAG_JOB, TAG_REQUEST
from providers.onprem import OnPremPool

from .builders import make_job


@dataclass(frozen=True)
class Host:
    name: str
    site: str
    vcpus: float
    memory_gib: float
    gpus: int = 0
    accelerator: str | None = None
    arch: str = "amd64"
    owned_usd_per_hour: float = 0.0
    local: bool = True


@dataclass
class Inventory:
    hosts: list[Host]

    def offers(self) -> list[Offer]:
        return [
            Offer(InstanceType(h.name, h.vcpus, h.memory_gib, h.gpus), Location("onprem", h.site, None,
                  SiteKind.ONPREM), Capacity.OWNED, h.owned_usd_per_hour)
            for h in self.hosts
        ]


INV = Inventory([Host("localhost", "lab", 4, 8, gpus=2), Host("rack-1", "dc1", 8, 32, local=False)])


def local_offer() -> Offer:
    return INV.offers()[0]


def wait_ended(pool: OnPremPool, iid: str, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        inst = pool.instance(iid)
        if inst.state is not InstanceState.RUNNING:
            return inst
        time.sleep(0.02)
    raise AssertionError(f"{iid} still running")


PY = sys.executable


def test_round_trip_runs_the_command_for_real_and_records_output_and_exit(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path)
    job = make_job(
        command=(PY, "-c", "import os,pathlib; pathlib.Path('out.txt').write_text(os.environ['GREETING']+"
                 "os.environ['HB_JOB']); print('to stdout'); raise SystemExit(3)"),
        env={"GREETING": "hello-"},
    )
    [inst] = pool.launch(local_offer(), 1, "req-a", tags={TAG_JOB: "job-a"}, job=job)
    assert inst.provider == "onprem" and inst.state is InstanceState.RUNNING and not inst.dry_run
    assert [i.id for i in pool.instances({TAG_JOB: "job-a"})] == [inst.id]
    ended = wait_ended(pool, inst.id)
    assert ended.state is InstanceState.FAILED and ended.exit_code == 3
    out_file = tmp_path / "runs" / inst.id / "work" / "out.txt"
    assert out_file.read_text() == "hello-job-a"
    stdout, _ = pool.logs(inst.id)
    assert stdout.read_text() == "to stdout\n"
    usage = pool.usage(inst.id)
    assert usage is not None and usage["max_rss_mib"] > 1 and usage["cpu_seconds"] > 0
    pool.terminate([inst.id], "req-a:stop")
    assert pool.instance(inst.id).state is InstanceState.TERMINATED


def test_a_successful_command_is_succeeded_with_exit_code_zero(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path)
    [inst] = pool.launch(local_offer(), 1, "req-ok", tags={}, job=make_job(command=("true",)))
    ended = wait_ended(pool, inst.id)
    assert (ended.state, ended.exit_code) == (InstanceState.SUCCEEDED, 0)
    assert ended.tags[TAG_REQUEST] == "req-ok"


def test_an_unknown_command_fails_with_127_and_says_why(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path)
    [inst] = pool.launch(local_offer(), 1, "req-x", tags={}, job=make_job(command=("no-such-binary-hb",)))
    ended = wait_ended(pool, inst.id)
    assert (ended.state, ended.exit_code) == (InstanceState.FAILED, 127)
    assert "cannot start" in pool.logs(inst.id)[1].read_text()


def test_capacity_is_tracked_and_a_full_host_raises_capacity_error(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path, grace_seconds=1)
    sleeper = make_job(command=("sleep", "30"), vcpus=3, memory_gib=1)
    [a] = pool.launch(local_offer(), 1, "req-1", tags={}, job=sleeper)
    assert pool.free()["localhost"]["vcpus"] == 1
    with pytest.raises(CapacityError, match="To fix"):
        pool.launch(local_offer(), 1, "req-2", tags={}, job=sleeper)
    pool.terminate([a.id], "req-1")
    assert pool.free()["localhost"]["vcpus"] == 4
    [b] = pool.launch(local_offer(), 1, "req-2", tags={}, job=sleeper)
    pool.terminate([b.id], "req-2")


def test_launch_is_idempotent_per_request_id(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path, grace_seconds=1)
    job = make_job(command=("sleep", "30"))
    first = pool.launch(local_offer(), 1, "req-same", tags={}, job=job)
    again = pool.launch(local_offer(), 1, "req-same", tags={}, job=job)
    assert [i.id for i in first] == [i.id for i in again]
    assert len(list((tmp_path / "runs").iterdir())) == 1
    pool.terminate([first[0].id], "x")


def test_gpus_are_allocated_distinctly_and_exported(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path)
    job = make_job(command=(PY, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"))
    job = type(job)(**{**{f: getattr(job, f) for f in job.__dataclass_fields__},
                       "request": type(job.request)(name="g", vcpus=1, memory_gib=0.5, gpus=1)})
    a, b = pool.launch(local_offer(), 2, "req-g", tags={}, job=job)
    outs = sorted(pool.logs(i.id)[0].read_text().strip() for i in (wait_ended(pool, a.id), wait_ended(pool, b.id)))
    assert outs == ["0", "1"]


def test_stop_sends_sigterm_so_the_job_can_checkpoint(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path)
    script = (
        "import os,signal,sys,time,pathlib\n"
        "def h(s,f):\n"
        "    pathlib.Path(os.environ['HB_CHECKPOINT_DIR']).mkdir(parents=True, exist_ok=True)\n"
        "    pathlib.Path(os.environ['HB_CHECKPOINT_DIR'], 'ckpt').write_text('step 7')\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, h)\n"
        "pathlib.Path('ready').write_text('1')\n"
        "time.sleep(60)\n"
    )
    [inst] = pool.launch(local_offer(), 1, "req-c", tags={}, job=make_job(command=(PY, "-c", script)))
    ready = tmp_path / "runs" / inst.id / "work" / "ready"
    deadline = time.monotonic() + 20
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    stopped = pool.stop(inst.id, grace_seconds=10)
    assert stopped.exit_code == 143
    assert (tmp_path / "runs" / inst.id / "checkpoint" / "ckpt").read_text() == "step 7"


def test_a_job_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path)
    script = "import signal,time,pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
             "pathlib.Path('ready').write_text('1'); time.sleep(60)"
    [inst] = pool.launch(local_offer(), 1, "req-k", tags={}, job=make_job(command=(PY, "-c", script)))
    ready = tmp_path / "runs" / inst.id / "work" / "ready"
    deadline = time.monotonic() + 20
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    stopped = pool.stop(inst.id, grace_seconds=0.3)
    assert stopped.state is InstanceState.FAILED and stopped.exit_code == -int(signal.SIGKILL)


def test_a_restarted_pool_re_adopts_live_runs_and_their_capacity(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path, grace_seconds=1)
    [inst] = pool.launch(local_offer(), 1, "req-r", tags={TAG_JOB: "j-r"},
                         job=make_job(command=("sleep", "30"), vcpus=2))
    restarted = OnPremPool(INV, tmp_path, grace_seconds=1)
    [seen] = restarted.instances({TAG_JOB: "j-r"})
    assert seen.id == inst.id and seen.state is InstanceState.RUNNING
    assert restarted.free()["localhost"]["vcpus"] == 2
    restarted.terminate([seen.id], "cleanup")
    deadline = time.monotonic() + 10
    while pool.instance(inst.id).state is InstanceState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.02)
    assert restarted.instance(inst.id).state is InstanceState.TERMINATED


def test_a_remote_host_is_simulated_on_the_clock_and_labelled(tmp_path: Path) -> None:
    clock = ManualClock()
    pool = OnPremPool(INV, tmp_path, clock=clock)
    rack = INV.offers()[1]
    [inst] = pool.launch(rack, 1, "req-s", tags={}, job=make_job(duration_hours=2, vcpus=8))
    assert inst.dry_run and inst.state is InstanceState.RUNNING
    with pytest.raises(CapacityError):
        pool.launch(rack, 1, "req-s2", tags={}, job=make_job(vcpus=1))
    clock.advance(2 * 3600)
    assert pool.instance(inst.id).state is InstanceState.SUCCEEDED
    assert pool.free()["rack-1"]["vcpus"] == 8
    pool.terminate([inst.id], "done")  # step 6's clean-up of an ended run: marked, dropped from memory
    assert pool.instances() == [] and pool.instance(inst.id).state is InstanceState.TERMINATED
    again = OnPremPool(INV, tmp_path, clock=clock)
    assert again.instances() == [] and again.instance(inst.id).state is InstanceState.TERMINATED


def test_a_local_launch_without_a_command_is_an_invalid_request(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path)
    with pytest.raises(InvalidRequestError, match="spec.command"):
        pool.launch(local_offer(), 1, "req-n", tags={}, job=make_job())


def test_without_an_inventory_the_pool_is_this_machine(tmp_path: Path) -> None:
    pool = OnPremPool(None, tmp_path)
    [offer] = pool.offers()
    assert offer.instance_type.name == "localhost" and offer.capacity is Capacity.OWNED
    assert offer.instance_type.vcpus >= 1 and offer.instance_type.memory_gib > 0


# --- issue 17: sandboxed runs (a namespace user, a clean environment, a private directory) ------------

SYS_PY = "/usr/bin/python3"  # the interpreter of the pytest run may live where a job user cannot go
needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or not os.path.exists(SYS_PY) or not shutil.which("useradd"),
    reason="dropping privileges needs root, useradd and /usr/bin/python3",
)

PROBE = """
import json, os, sys
res = {"uid": os.getuid(), "groups": os.getgroups(), "env": sorted(os.environ)}
for name, path in json.loads(sys.argv[1]).items():
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        res[name] = "read"
    except OSError as exc:
        res[name] = type(exc).__name__
open("mine.txt", "w").write("private")
print(json.dumps(res))
"""


@pytest.fixture
def open_data_dir() -> Iterator[Path]:
    """A data dir whose parents others may pass (as an operator's /srv/broker would be), with a database,
    a CA key and a log left world-readable, the way they were before the broker secured them."""
    base = Path(tempfile.mkdtemp(prefix="hb17-"))
    os.chmod(base, 0o755)
    data = base / "data"
    (data / "ca").mkdir(parents=True)
    for rel in ("broker.db", "ca/ca.key", "server.log"):
        (data / rel).write_text("secret")
        os.chmod(data / rel, 0o644)
    os.chmod(data, 0o755)
    os.chmod(data / "ca", 0o755)
    try:
        yield data
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _probe(pool: OnPremPool, ns: str, req: str, targets: dict[str, str]) -> tuple[dict, str]:
    job = make_job(command=(SYS_PY, "-c", PROBE, json.dumps(targets)), env={"MINE": "1"})
    [inst] = pool.launch(local_offer(), 1, req, tags={TAG_JOB: req, "hb-namespace": ns}, job=job)
    ended = wait_ended(pool, inst.id)
    stdout, stderr = pool.logs(inst.id)
    assert ended.state is InstanceState.SUCCEEDED, stderr.read_text()
    return json.loads(stdout.read_text()), inst.id


@needs_root
def test_a_sandboxed_job_cannot_read_the_data_dir_the_ca_key_the_broker_environ_or_another_tenant(
    open_data_dir: Path,
) -> None:
    pool = OnPremPool(INV, open_data_dir, sandbox="user")
    data = open_data_dir
    first, a_iid = _probe(pool, "team-a", "req-a", {})
    a_run = data / "runs" / a_iid
    assert (a_run / "work" / "mine.txt").read_text() == "private"
    targets = {
        "data_dir": str(data), "db": str(data / "broker.db"), "ca_key": str(data / "ca" / "ca.key"),
        "ca_dir": str(data / "ca"), "log": str(data / "server.log"), "runs": str(data / "runs"),
        "broker_environ": f"/proc/{os.getpid()}/environ",
        "other_stdout": str(a_run / "stdout.log"), "other_run_json": str(a_run / "run.json"),
        "other_work": str(a_run / "work"), "other_file": str(a_run / "work" / "mine.txt"),
    }
    got, b_iid = _probe(pool, "team-b", "req-b", targets)
    denied = {k: v for k, v in got.items() if k in targets}
    assert denied == {k: "PermissionError" for k in targets}, denied
    assert got["uid"] != 0 and got["uid"] != first["uid"]  # one user per namespace, never root
    assert got["groups"] in ([], [pwd.getpwuid(got["uid"]).pw_gid])
    assert pwd.getpwuid(got["uid"]).pw_name.startswith("hbj-team-b-")
    # a clean environment: nothing of the broker's (tokens, database URL), only the job's and HB_*
    assert set(got["env"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "MINE", "HB_JOB", "HB_INSTANCE_ID", "HB_RUN_DIR",
                               "HB_CHECKPOINT_DIR", "LC_CTYPE"}
    # the broker's own files are private now; its logs of the run are root's, 0600
    for rel in ("broker.db", "ca/ca.key", "server.log"):
        assert stat.S_IMODE((data / rel).stat().st_mode) == 0o600, rel
    assert stat.S_IMODE((data / "ca").stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "runs" / b_iid / "stdout.log").stat().st_mode) == 0o600


@needs_root
def test_a_job_of_one_namespace_cannot_kill_or_signal_the_broker(open_data_dir: Path) -> None:
    pool = OnPremPool(INV, open_data_dir, sandbox="user")
    script = f"import os, signal\ntry:\n    os.kill({os.getpid()}, 0)\n    print('reached')\nexcept OSError as e:\n" \
             "    print(type(e).__name__)"
    job = make_job(command=(SYS_PY, "-c", script))
    [inst] = pool.launch(local_offer(), 1, "req-k", tags={"hb-namespace": "team-a"}, job=job)
    wait_ended(pool, inst.id)
    assert pool.logs(inst.id)[0].read_text().strip() == "PermissionError"


@pytest.mark.parametrize("workdir", ["../../..", "/etc", "a/../../b"])
def test_a_working_dir_that_leaves_the_run_directory_is_refused(tmp_path: Path, workdir: str) -> None:
    pool = OnPremPool(INV, tmp_path)
    job = dataclasses.replace(make_job(command=("true",)), workdir=workdir)
    with pytest.raises(InvalidRequestError, match="workingDir"):
        pool.launch(local_offer(), 1, "req-w", tags={}, job=job)
    assert pool.instances() == []


def test_a_relative_working_dir_is_made_inside_the_work_directory(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path)
    job = dataclasses.replace(make_job(command=("sh", "-c", "pwd")), workdir="src/app")
    [inst] = pool.launch(local_offer(), 1, "req-rw", tags={}, job=job)
    wait_ended(pool, inst.id)
    assert pool.logs(inst.id)[0].read_text().strip() == str(tmp_path / "runs" / inst.id / "work" / "src" / "app")


def test_without_root_mode_user_refuses_to_run_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from providers.sandbox import Sandbox

    sandbox = Sandbox("user")
    sandbox.can_switch = False  # as a broker not started as root sees it
    with pytest.raises(InvalidRequestError, match="needs the broker to run as root"):
        OnPremPool(INV, tmp_path, sandbox=sandbox)  # broker serve refuses to start, saying why
    auto = Sandbox("auto")
    auto.can_switch = False
    pool = OnPremPool(INV, tmp_path, sandbox=auto)  # auto: one warning, jobs run as the broker's user
    [inst] = pool.launch(local_offer(), 1, "req-nr", tags={}, job=make_job(command=("true",)))
    assert wait_ended(pool, inst.id).state is InstanceState.SUCCEEDED


# --- issue 17: a broker killed during dispatch never runs a job twice -----------------------------------

CRASH_AFTER_POPEN = """
import os, signal, subprocess, sys
sys.path[:0] = [{root!r}]
from tests.providers.test_providers_onprem import INV, local_offer
from tests.providers.builders import make_job
from providers.onprem import OnPremPool

real = subprocess.Popen
def popen_then_die(*a, **k):  # the broker is SIGKILLed right after the run started, before it recorded it
    proc = real(*a, **k)
    os.kill(os.getpid(), signal.SIGKILL)
subprocess.Popen = popen_then_die
pool = OnPremPool(INV, {data!r})
pool.launch(local_offer(), 1, "req-crash", tags={{"hb-job": "job-crash"}},
            job=make_job(command=("sh", "-c", "echo started >> ../../../../starts.txt; sleep 2")))
"""


def test_sigkill_between_starting_a_run_and_recording_it_adopts_the_run_instead_of_starting_another(
    tmp_path: Path,
) -> None:
    data = tmp_path / "d"
    code = CRASH_AFTER_POPEN.format(root=str(Path(__file__).parents[2]), data=str(data))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    [run_json] = list((data / "runs").glob("*/run.json"))
    assert json.loads(run_json.read_text())["pid"] is None  # only the intent reached the disk
    pool = OnPremPool(INV, data)  # the restarted broker
    [inst] = pool.instances({TAG_JOB: "job-crash"})
    assert inst.state is InstanceState.RUNNING  # adopted by its runner's /proc entry
    again = pool.launch(local_offer(), 1, "req-crash", tags={TAG_JOB: "job-crash"},
                        job=make_job(command=("sh", "-c", "echo started >> ../../../../starts.txt")))
    assert [i.id for i in again] == [inst.id]
    assert wait_ended(pool, inst.id).state is InstanceState.SUCCEEDED
    assert (tmp_path / "starts.txt").read_text() == "started\n"


def test_an_intent_whose_process_never_started_reports_failed_not_running(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path)
    [inst] = pool.launch(local_offer(), 1, "req-i", tags={TAG_JOB: "job-i"}, job=make_job(command=("sleep", "5")))
    run_json = tmp_path / "runs" / inst.id / "run.json"
    rec = json.loads(run_json.read_text())
    pool.stop(inst.id, 0)
    (tmp_path / "runs" / inst.id / "exit.json").unlink(missing_ok=True)
    run_json.write_text(json.dumps(rec | {"pid": None}))  # as if the broker died before Popen
    [again] = OnPremPool(INV, tmp_path).instances({TAG_JOB: "job-i"})
    assert again.state is InstanceState.FAILED and again.exit_code is None


def test_adopt_picks_up_runs_another_broker_process_started(tmp_path: Path) -> None:
    first, second = OnPremPool(INV, tmp_path), OnPremPool(INV, tmp_path)
    [inst] = first.launch(local_offer(), 1, "req-o", tags={TAG_JOB: "job-o"}, job=make_job(command=("sleep", "5")))
    assert second.instances({TAG_JOB: "job-o"}) == []
    assert second.adopt() == 1
    assert [i.state for i in second.instances({TAG_JOB: "job-o"})] == [InstanceState.RUNNING]
    assert second.free()["localhost"]["vcpus"] == 3
    second.terminate([inst.id], "stop")
    assert first.instance(inst.id).state is not InstanceState.RUNNING


def test_ended_and_terminated_runs_leave_memory_but_stay_readable(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path)
    ids = []
    for i in range(6):  # more runs than the host holds at once: each ends and is terminated, as step 6 does
        [inst] = pool.launch(local_offer(), 1, f"req-m{i}", tags={TAG_JOB: f"job-m{i}"},
                             job=make_job(command=("sh", "-c", f"echo run-{i}")))
        wait_ended(pool, inst.id)
        pool.terminate([inst.id], "done")
        ids.append(inst.id)
    assert pool.instances() == [] and not pool._runs and not pool._procs, "memory holds only what may still run"
    assert pool.instance(ids[3]).state is InstanceState.TERMINATED
    assert pool.logs(ids[3])[0].read_text() == "run-3\n"
    assert OnPremPool(INV, tmp_path).instances() == [], "a restarted pool does not load them either"
