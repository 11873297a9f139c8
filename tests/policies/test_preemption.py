"""Preemption: victim choice (table), and the real scenario on the on-prem pool with subprocesses that
checkpoint on SIGTERM, get requeued and resume."""

from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.errors import CapacityError
from broker.model import Capacity, InstanceState, InstanceType, Location, Offer, SiteKind
from policies.preemption import find_victims
from policies.workload import Resources, Workload
from tests.policies.builders import T0, at, make_workload

HOST = "onprem:rack-a"


def running(id: str, *, cpu: float = 2, priority: int = 0, started: float = -3600, ckpt: float | None = None,
            host: str = HOST, **kw: object) -> Workload:
    return make_workload(id, cpu=cpu, priority=priority, started_at=at(started),
                         last_checkpoint_at=None if ckpt is None else at(ckpt), host=host, **kw)


GUARANTEED = {"cpu": 2, "memory": 2}


@pytest.mark.parametrize(
    ("preemptor", "victims", "free", "expected"),
    [
        (make_workload("p", cpu=2, priority=100), [running("a", ckpt=-600), running("b", ckpt=-5)],
         {HOST: Resources(0, 64, 0)}, ["b"]),
        (make_workload("p", cpu=2, priority=100), [running("a", ckpt=-5, priority=50), running("b", ckpt=-5)],
         {HOST: Resources(0, 64, 0)}, ["b"]),
        (make_workload("p", cpu=2, priority=100),
         [running("g", ckpt=-5, limits=GUARANTEED), running("be", ckpt=-5, cpu=0, memory=0, started=-3600),
          running("bu", ckpt=-5)],
         {HOST: Resources(0, 64, 0)}, ["bu"]),
        (make_workload("p", cpu=2, priority=100), [running("hi", priority=100, ckpt=-1), running("lo", ckpt=-900)],
         {HOST: Resources(0, 64, 0)}, ["lo"]),
        (make_workload("p", cpu=4, priority=100), [running("a", ckpt=-1), running("b", ckpt=-2), running("c", ckpt=-3)],
         {HOST: Resources(0, 64, 0)}, ["a", "b"]),
        (make_workload("p", cpu=4, priority=100), [running("small", cpu=1, ckpt=-1), running("big", cpu=4, ckpt=-2)],
         {HOST: Resources(0, 64, 0)}, ["big"]),
        (make_workload("p", cpu=2, priority=100), [running("a", ckpt=-1)], {HOST: Resources(2, 64, 0)}, []),
        (make_workload("p", cpu=2, priority=100),
         [running("a", ckpt=-100), running("b", ckpt=-10, host="onprem:rack-b")],
         {HOST: Resources(0, 64, 0), "onprem:rack-b": Resources(0, 64, 0)}, ["b"]),
        (make_workload("p", cpu=2, priority=100), [running("nock", started=-30), running("old", ckpt=-60)],
         {HOST: Resources(0, 64, 0)}, ["nock"]),
    ],
    ids=[
        "least work lost since the last checkpoint goes first",
        "equal work lost: lower priority goes first",
        "equal work lost and priority: Burstable before Guaranteed (BestEffort frees no cpu)",
        "equal or higher priority is never a victim",
        "victims are added until the preemptor fits",
        "victims not needed after all are spared",
        "no preemption when it already fits",
        "the host losing the least work is chosen",
        "a job without checkpoints loses everything since its start",
    ],
)
def test_victims(preemptor: Workload, victims: list[Workload], free: dict, expected: list[str]) -> None:
    plan = find_victims(preemptor, victims, free, now=T0)
    assert plan.possible
    assert [t.workload_id for t in plan.targets] == expected
    for t in plan.targets:
        assert t.reason.startswith(f"Preempted: by job p (priority 100 > {t.priority})")


def test_impossible_and_never_policies_explain_themselves_and_change_nothing() -> None:
    victims = (running("a", cpu=2, ckpt=-5),)
    free = {HOST: Resources(0, 64, 0)}
    never = find_victims(make_workload("p", cpu=2, priority=9, preemption_policy="Never"), victims, free, now=T0)
    assert not never.possible and "preemptionPolicy Never" in never.explanation
    huge = find_victims(make_workload("p", cpu=64, priority=9), victims, free, now=T0)
    assert not huge.possible and huge.explanation.startswith("PreemptionImpossible")
    assert free == {HOST: Resources(0, 64, 0)} and victims[0].host == HOST


# --- the real scenario -------------------------------------------------------------------------------

COUNTER = Path(__file__).resolve().parents[2] / "examples" / "preemption" / "checkpoint_counter.py"
STEP_S, INTERVAL_S, TARGET = 0.05, 0.5, 60


@dataclass(frozen=True)
class _Host:
    name: str = "rack-a-1"
    site: str = "rack-a"
    vcpus: float = 1.0
    memory_gib: float = 4.0
    gpus: int = 0
    accelerator: str | None = None
    arch: str = "amd64"
    owned_usd_per_hour: float = 0.0
    local: bool = True


class _Inventory:
    """A constrained pool: one real local host with a single vCPU."""

    hosts = (_Host(),)

    def offers(self) -> list[Offer]:
        h = self.hosts[0]
        return [Offer(InstanceType(h.name, h.vcpus, h.memory_gib), Location("onprem", h.site, None, SiteKind.ONPREM),
                      Capacity.OWNED, 0.0)]


def _spec(name: str, command: list[str], *, priority_class: str, ckpt: Path | None = None) -> object:
    from broker.spec import parse_job_spec

    doc: dict = {"apiVersion": "hybrid-broker/v1", "kind": "Job",
                 "metadata": {"name": name, "namespace": "team-a"},
                 "spec": {"priorityClassName": priority_class, "command": command,
                          "resources": {"requests": {"cpu": "1", "memory": "256Mi"}},
                          "durationHours": 0.01, "placement": {"providers": ["onprem"]}}}
    if ckpt is not None:
        doc["spec"]["checkpoint"] = {"path": str(ckpt), "intervalMinutes": INTERVAL_S / 60}
    return parse_job_spec(doc)


def _wait(pool: object, iid: str, timeout: float = 30.0) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        inst = pool.instance(iid)  # type: ignore[attr-defined]
        if inst.state in (InstanceState.SUCCEEDED, InstanceState.FAILED, InstanceState.TERMINATED):
            return inst
        time.sleep(0.05)
    raise AssertionError(f"{iid} did not finish in {timeout} s")


def _free(pool: object) -> dict[str, Resources]:
    return {h: Resources(f["vcpus"], f["memory_gib"], f["gpus"])
            for h, f in pool.free().items()}  # type: ignore[attr-defined]


@pytest.mark.slow
def test_preempted_counter_checkpoints_requeues_resumes_and_loses_at_most_one_interval(tmp_path: Path) -> None:
    providers_onprem = pytest.importorskip("providers.onprem")
    pool = providers_onprem.OnPremPool(_Inventory(), tmp_path / "data", grace_seconds=5.0)
    offer = _Inventory().offers()[0]
    ckpt = tmp_path / "ckpt"
    low_cmd = [sys.executable, str(COUNTER), "--target", str(TARGET), "--step-seconds", str(STEP_S),
               "--interval-seconds", str(INTERVAL_S)]
    low_spec = _spec("counter", low_cmd, priority_class="low", ckpt=ckpt)
    high_spec = _spec("urgent", [sys.executable, "-c", "print('urgent work done')"], priority_class="high")

    # 1. the low-priority counter runs on the single-vCPU host
    started = datetime.now(UTC)
    low_inst = pool.launch(offer, 1, f"low-{uuid.uuid4().hex}", tags={"hb-job": "counter"}, job=low_spec)[0]
    state_file = ckpt / "state.json"
    end = time.monotonic() + 15
    while not state_file.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert state_file.exists(), "the counter never wrote a checkpoint"
    time.sleep(0.3)

    # 2. the high-priority job does not fit
    with pytest.raises(CapacityError):
        pool.launch(offer, 1, f"high-{uuid.uuid4().hex}", tags={"hb-job": "urgent"}, job=high_spec)

    # 3. preemption picks the counter, computed from the live pool's snapshot
    written_at = datetime.fromtimestamp(json.loads(state_file.read_text())["written_at"], UTC)
    low = Workload.from_spec("counter", low_spec, created_at=started, priority=10, started_at=started,  # type: ignore[arg-type]
                             last_checkpoint_at=written_at, host=_Host().name)
    high = Workload.from_spec("urgent", high_spec, created_at=datetime.now(UTC), priority=1000)  # type: ignore[arg-type]
    plan = find_victims(high, [low], _free(pool), now=datetime.now(UTC))
    assert plan.possible and [t.workload_id for t in plan.targets] == ["counter"]
    assert plan.targets[0].work_lost_seconds <= INTERVAL_S + 1.0

    # 4. the broker applies it: SIGTERM with a grace period -> the counter checkpoints and exits 143
    stopped = pool.stop(low_inst.id, grace_seconds=5.0)
    assert stopped.exit_code == 143, stopped
    at_preemption = json.loads(state_file.read_text())["count"]
    assert 0 < at_preemption < TARGET

    # 5. the urgent job runs on the freed vCPU
    high_inst = pool.launch(offer, 1, f"high-{uuid.uuid4().hex}", tags={"hb-job": "urgent"}, job=high_spec)[0]
    assert _wait(pool, high_inst.id).exit_code == 0  # type: ignore[attr-defined]

    # 6. requeued, the counter restarts from its checkpoint and finishes with the right result
    again = pool.launch(offer, 1, f"low-{uuid.uuid4().hex}", tags={"hb-job": "counter"}, job=low_spec)[0]
    assert _wait(pool, again.id).exit_code == 0  # type: ignore[attr-defined]
    result = json.loads((ckpt / "result.json").read_text())
    assert result["count"] == TARGET and result["sum"] == TARGET * (TARGET + 1) // 2

    runs = [dict(kv.split("=") for kv in line.split()) for line in (ckpt / "runs.log").read_text().splitlines()]
    assert [r["reason"] for r in runs] == ["preempted", "done"]
    assert int(runs[1]["start"]) == at_preemption
    steps_done = sum(int(r["end"]) - int(r["start"]) for r in runs)
    lost_steps = steps_done - TARGET
    assert 0 <= lost_steps <= INTERVAL_S / STEP_S, f"lost {lost_steps} steps, more than one checkpoint interval"
    assert timedelta(0) <= datetime.now(UTC) - started < timedelta(seconds=60)
