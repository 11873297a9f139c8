"""The on-prem pool runs the job's command for real, tracks capacity, cancels, and survives a restart."""

from __future__ import annotations

import signal
import sys
import time
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


def test_a_local_launch_without_a_command_is_an_invalid_request(tmp_path: Path) -> None:
    pool = OnPremPool(INV, tmp_path)
    with pytest.raises(InvalidRequestError, match="spec.command"):
        pool.launch(local_offer(), 1, "req-n", tags={}, job=make_job())


def test_without_an_inventory_the_pool_is_this_machine(tmp_path: Path) -> None:
    pool = OnPremPool(None, tmp_path)
    [offer] = pool.offers()
    assert offer.instance_type.name == "localhost" and offer.capacity is Capacity.OWNED
    assert offer.instance_type.vcpus >= 1 and offer.instance_type.memory_gib > 0
