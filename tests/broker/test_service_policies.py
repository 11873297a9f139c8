"""The scheduling policies wired into the broker, end to end on SQLite and PostgreSQL: quotas, budgets,
priority classes and reservations at admission; priority at submission; queue disciplines and fair share
fed by finished runs; the deadline premium; preemption with checkpoint and restore through
``Scheduler.run_cycle()`` with real subprocesses; outcomes and spend in the terminal transaction."""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml

from broker.clock import Clock, ManualClock, SystemClock
from broker.model import Instance
from broker.store import JobRow
from providers.base import Capability
from providers.dryrun import DryRunProvider
from tests.broker.service_support import ADMIN_H, job_doc, make_app, serve_in_thread

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "preemption"


def _inventory(tmp_path: Path, hosts: list[dict[str, Any]], sites: list[dict[str, Any]] | None = None) -> Path:
    path = tmp_path / "inventory-policies.yaml"
    path.write_text(yaml.safe_dump({"sites": sites or [{"name": "local", "continent": "eu", "uplink_gbps": 1}],
                                    "hosts": hosts}))
    return path


LOCAL_2CPU = {"name": "localhost", "site": "local", "vcpus": 2, "memory_gib": 4, "gpus": 0,
              "owned_usd_per_hour": 0, "local": True}


class BilledClockRuns(DryRunProvider):
    """Runs that succeed after their ``durationHours`` on the clock, as :class:`DryRunProvider`'s do, but
    **billed** (not dry-run): a stand-in for a cloud whose VMs run the estimate, so budgets see real spend."""

    def __init__(self, name: str, *, clock: Clock) -> None:
        super().__init__(name, clock=clock)
        self.capabilities = (self.capabilities - {Capability.DRY_RUN}) | {Capability.RUNS_WORK}

    def launch(self, *args: Any, **kwargs: Any) -> list[Instance]:
        return [dataclasses.replace(i, dry_run=False) for i in super().launch(*args, **kwargs)]

    def instances(self, tags: Any = None) -> list[Instance]:
        return [dataclasses.replace(i, dry_run=False) for i in super().instances(tags)]


class Broker:
    """A broker app on a real uvicorn with a clock, the on-prem pool of ``hosts``, a billed ``aws`` and a
    dry-run ``gcp`` (runs of both succeed after their ``durationHours`` on the clock); the scheduler is
    driven by hand."""

    def __init__(self, tmp_path: Path, store_url: str, *, clock: Clock, hosts: list[dict[str, Any]] | None = None,
                 sites: list[dict[str, Any]] | None = None, grace_seconds: float = 5.0) -> None:
        import pricing
        from providers.onprem import OnPremPool

        self.clock = clock
        inventory_path = _inventory(tmp_path, hosts or [LOCAL_2CPU], sites)
        inventory = pricing.load_inventory(inventory_path)
        self.pool = OnPremPool(inventory, tmp_path / "data", clock=clock, grace_seconds=grace_seconds)
        self.app = make_app(tmp_path, store_url, clock=clock, inventory=inventory_path,
                            providers={"onprem": self.pool, "aws": BilledClockRuns("aws", clock=clock),
                                       "gcp": DryRunProvider("gcp", clock=clock)})
        self.hb = self.app.state.hb
        self.scheduler = self.hb.scheduler

    def start(self) -> Iterator[httpx.Client]:
        with serve_in_thread(self.app) as url, httpx.Client(base_url=url, timeout=30) as client:
            self.client = client
            yield client

    def tenant(self, name: str | None = None) -> str:
        ns = name or f"team-{secrets.token_hex(3)}"
        assert self.client.post("/v1/namespaces", json={"name": ns}, headers=ADMIN_H).status_code == 201
        return ns

    def apply(self, *docs: dict[str, Any]) -> None:
        r = self.client.post("/v1/policies:apply", json={"items": list(docs)}, headers=ADMIN_H)
        assert r.status_code in (200, 201), r.text

    def submit(self, ns: str, *docs: dict[str, Any]) -> list[str]:
        r = self.client.post(f"/v1/namespaces/{ns}/jobs", json=list(docs), headers=ADMIN_H)
        assert r.status_code == 201, r.text
        return [j["id"] for j in r.json()["jobs"]]

    def get(self, ns: str, job_id: str) -> dict[str, Any]:
        r = self.client.get(f"/v1/namespaces/{ns}/jobs/{job_id}", headers=ADMIN_H)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def state(self, job_id: str) -> str:
        with self.hb.store.read() as session:
            row = session.get(JobRow, job_id)
            assert row is not None
            return row.state

    def until(self, job_ids: list[str], states: set[str], seconds: float = 15.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.scheduler.run_cycle()
            if all(self.state(j) in states for j in job_ids):
                return
            time.sleep(0.05)
        raise AssertionError({j: self.state(j) for j in job_ids})

    def sql(self, text: str, **params: Any) -> list[Any]:
        with self.hb.store.read() as session:
            return list(session.execute(sa.text(text), params))

    def close(self) -> None:
        live = [i.id for i in self.pool.instances() if i.state.value == "RUNNING"]
        if live:
            self.pool.terminate(live, "test-cleanup")


@pytest.fixture
def broker(tmp_path: Path, store_url: str) -> Iterator[Broker]:
    b = Broker(tmp_path, store_url, clock=ManualClock())
    for _ in b.start():
        yield b
    b.close()


def quota(ns: str, **hard: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": ns},
            "spec": {"hard": hard}}


def budget(ns: str, daily_usd: float, enforcement: str) -> dict[str, Any]:
    return {"apiVersion": "hybrid-broker/v1", "kind": "Budget", "metadata": {"name": "money", "namespace": ns},
            "spec": {"dailyUSD": daily_usd, "enforcement": enforcement}}


def priority_class(name: str, value: int, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, **extra}


# ------------------------------------------------------------------------------------------ admission


def test_a_quota_holds_the_job_with_a_readable_reason_until_room_frees(broker: Broker) -> None:
    ns = broker.tenant()
    broker.apply(quota(ns, **{"requests.cpu": "4"}))
    ids = broker.submit(ns, *[job_doc(f"q-{i}", cpu="2", providers=["aws"], hours=1) for i in range(3)])
    report = broker.scheduler.run_cycle()
    assert (report.placed, report.held) == (2, 1)
    held = broker.get(ns, ids[2])
    assert held["state"] == "PENDING"
    assert held["held_reason"].startswith("QuotaExceeded: requests.cpu 4/4, job needs 2")
    assert any(e["reason"].startswith("held: QuotaExceeded") for e in held["events"])
    records = broker.sql("SELECT job_id FROM decision_records WHERE kind = 'placement'")
    assert sorted(r.job_id for r in records) == sorted(ids[:2]), "one decision record per placed job"
    broker.clock.advance(3601)  # type: ignore[attr-defined]
    broker.scheduler.run_cycle()  # the two runs end: room for the third
    broker.scheduler.run_cycle()
    assert broker.state(ids[2]) in ("RUNNING", "SUCCEEDED")
    assert broker.get(ns, ids[2])["held_reason"] is None


@pytest.mark.parametrize(("enforcement", "second_state", "event_prefix"), [
    ("hard", "PENDING", "held: BudgetExceeded"),
    ("soft", "RUNNING", "BudgetAlert"),
], ids=["a hard budget holds the job that would cross it",
        "a soft budget admits it and writes an alert event on the job"])
def test_budgets_at_admission(broker: Broker, enforcement: str, second_state: str, event_prefix: str) -> None:
    ns = broker.tenant()
    doc = job_doc("b", cpu="4", memory="8Gi", providers=["aws"], hours=10)
    (first,) = broker.submit(ns, doc)
    broker.scheduler.run_cycle()
    cost = broker.get(ns, first)["cost"]["total_usd"]
    assert cost > 0
    broker.apply(budget(ns, cost * 1.5, enforcement))
    (second,) = broker.submit(ns, dict(doc, metadata={"name": "b2"}))
    broker.scheduler.run_cycle()
    got = broker.get(ns, second)
    assert got["state"] == second_state
    assert any(e["reason"].startswith(event_prefix) for e in got["events"]), got["events"]
    if enforcement == "hard":
        assert got["held_reason"].startswith("BudgetExceeded:")


def test_dry_run_jobs_consume_no_budget_and_their_spend_is_shown_apart(
        broker: Broker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ns = broker.tenant()
    (real,) = broker.submit(ns, job_doc("real", cpu="4", memory="8Gi", providers=["aws"], hours=10))
    broker.scheduler.run_cycle()
    cost = broker.get(ns, real)["cost"]["total_usd"]
    assert cost > 0 and broker.get(ns, real)["dry_run"] is False
    broker.apply(budget(ns, cost * 1.5, "hard"))
    # three simulated jobs, each dearer than what is left of the budget: admitted, as they bill nothing
    sims = broker.submit(ns, *[job_doc(f"sim-{i}", cpu="4", memory="8Gi", providers=["gcp"], hours=10)
                               for i in range(3)])
    broker.scheduler.run_cycle()
    got = [broker.get(ns, s) for s in sims]
    assert [(g["state"], g["dry_run"], g["held_reason"]) for g in got] == [("RUNNING", True, None)] * 3
    simulated = sum(g["cost"]["total_usd"] for g in got)
    assert simulated > cost * 0.5, "they would have crossed the budget had they counted"
    # the real spend still counts: a second billed job over the budget is held
    (held,) = broker.submit(ns, job_doc("real-2", cpu="4", memory="8Gi", providers=["aws"], hours=10))
    broker.scheduler.run_cycle()
    assert broker.get(ns, held)["held_reason"].startswith("BudgetExceeded: daily budget of")
    burn = broker.client.get(f"/v1/namespaces/{ns}/budget", headers=ADMIN_H).json()["burn"]
    assert burn["today_usd"] == pytest.approx(cost, rel=1e-6)
    assert burn["dry_run_today_usd"] == pytest.approx(simulated, rel=1e-6)
    assert burn["dry_run_month_usd"] == pytest.approx(simulated, rel=1e-6)
    # the runs end 1 h late: the simulated correction stays simulated, the real one is real
    broker.clock.advance(11 * 3600)  # type: ignore[attr-defined]
    broker.scheduler.run_cycle()
    assert [broker.state(s) for s in sims] == ["SUCCEEDED"] * 3 and broker.state(real) == "SUCCEEDED"
    kinds = {r.job_id: r.kind for r in broker.sql("SELECT job_id, kind FROM policy_spend")}
    assert kinds == {real: "actual"} | {s: "dry-run" for s in sims}
    burn = broker.client.get(f"/v1/namespaces/{ns}/budget", headers=ADMIN_H).json()["burn"]
    assert burn["today_usd"] == pytest.approx(cost * 1.1, rel=1e-3)
    assert burn["dry_run_today_usd"] == pytest.approx(simulated * 1.1, rel=1e-3)
    # the CLI shows the two apart
    from broker.cli import main

    monkeypatch.setenv("BROKER_URL", str(broker.client.base_url).rstrip("/"))
    monkeypatch.setenv("BROKER_TOKEN", ADMIN_H["Authorization"].split()[1])
    with pytest.raises(SystemExit) as exc:
        main(["policies", "budget", ns])
    out = capsys.readouterr().out
    assert exc.value.code in (0, None)
    assert f"today ${cost * 1.1:.2f}" in out
    assert f"dry-run (simulated, not in the budget): today ${simulated * 1.1:.2f}" in out


def test_an_on_prem_only_job_is_held_by_a_reservation_for_another_class(broker: Broker) -> None:
    ns = broker.tenant()
    broker.apply(priority_class("train", 500),
                 {"apiVersion": "hybrid-broker/v1", "kind": "Reservation", "metadata": {"name": "keep"},
                  "spec": {"pool": "localhost", "resources": {"cpu": "1"}, "priorityClassName": "train"}})
    (job,) = broker.submit(ns, job_doc("r", cpu="2", providers=["onprem"]))
    broker.scheduler.run_cycle()
    assert broker.get(ns, job)["held_reason"].startswith("ReservedCapacity: localhost")


# ------------------------------------------------------------------------------------------ priority


def test_priority_classes_resolve_at_submission_and_an_unknown_class_is_422(broker: Broker) -> None:
    ns = broker.tenant()
    broker.apply(priority_class("high", 1000), priority_class("std", 10, globalDefault=True))
    ids = broker.submit(ns, job_doc("h", priorityClassName="high"), job_doc("d"), job_doc("raw", priority=7))
    assert [broker.get(ns, i)["priority"] for i in ids] == [1000, 10, 7]
    bad = broker.client.post(f"/v1/namespaces/{ns}/jobs", json=job_doc("x", priorityClassName="urgent"),
                             headers=ADMIN_H)
    assert bad.status_code == 422 and bad.json()["field"] == "spec.priorityClassName"
    assert "urgent" in bad.json()["detail"] and "high" in bad.json()["detail"]
    two = [job_doc("ok"), job_doc("x", priorityClassName="nope")]
    burst = broker.client.post(f"/v1/namespaces/{ns}/jobs", json=two, headers=ADMIN_H)
    assert burst.status_code == 422 and burst.json()["field"] == "[1].spec.priorityClassName"
    listed = broker.client.get(f"/v1/namespaces/{ns}/jobs", headers=ADMIN_H).json()["jobs"]
    assert len(listed) == 3, "a refused burst stores nothing"


# ------------------------------------------------------------------------------------------ deadlines


def test_a_deadline_that_passed_while_queued_fails_the_job_at_once(broker: Broker) -> None:
    ns = broker.tenant()
    (blocker,) = broker.submit(ns, job_doc("blocker", providers=["onprem"], cpu="2", command=["sleep", "30"]))
    broker.scheduler.run_cycle()
    assert broker.state(blocker) == "RUNNING"
    soon = (broker.clock.now() + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (job,) = broker.submit(ns, job_doc("late", providers=["onprem"], cpu="2", deadline=soon))
    broker.scheduler.run_cycle()
    assert broker.state(job) == "PENDING", "it waits for on-prem room while the deadline is ahead"
    broker.clock.advance(600)  # type: ignore[attr-defined]
    broker.scheduler.run_cycle()
    got = broker.get(ns, job)
    assert got["state"] == "FAILED" and got["message"].startswith("DeadlineInfeasible: the deadline")


def test_a_deadline_no_option_can_meet_fails_at_once_naming_the_fastest(broker: Broker) -> None:
    ns = broker.tenant()
    due = (broker.clock.now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (job,) = broker.submit(ns, job_doc("slow", providers=["aws"], hours=5, deadline=due))
    broker.scheduler.run_cycle()
    got = broker.get(ns, job)
    assert got["state"] == "FAILED"
    assert got["message"].startswith("DeadlineInfeasible: no option finishes by") and "h late" in got["message"]


def test_meeting_a_deadline_records_its_premium_over_the_cheapest(tmp_path: Path, store_url: str) -> None:
    # A big owned box behind a slow uplink is the cheapest (no compute bill, modest egress) but its data
    # transfer makes it late; the cloud region next to the data meets the deadline for more money.
    sites = [{"name": "local", "continent": "eu", "uplink_gbps": 1},
             {"name": "remote", "continent": "na", "uplink_gbps": 0.1}]
    hosts = [LOCAL_2CPU, {"name": "bigbox", "site": "remote", "vcpus": 64, "memory_gib": 256, "gpus": 0,
                          "owned_usd_per_hour": 0, "local": False}]
    b = Broker(tmp_path, store_url, clock=ManualClock(), hosts=hosts, sites=sites)
    for _ in b.start():
        ns = b.tenant()
        due = (b.clock.now() + timedelta(hours=11)).strftime("%Y-%m-%dT%H:%M:%SZ")
        data = [{"uri": "s3://bucket/set", "location": "aws:us-east-1", "sizeGiB": 100}]
        free = job_doc("free", cpu="64", memory="128Gi", hours=10, providers=["onprem", "aws"], data=data)
        (cheap,) = b.submit(ns, free)
        b.scheduler.run_cycle()
        cheapest = b.get(ns, cheap)["placement"]
        assert (cheapest["provider"], cheapest["instance_type"]) == ("onprem", "bigbox")
        (urgent,) = b.submit(ns, dict(free, metadata={"name": "urgent"}, spec=dict(free["spec"], deadline=due)))
        b.scheduler.run_cycle()
        got = b.get(ns, urgent)
        assert got["placement"]["provider"] == "aws"
        premium = got["placement"]["total_usd"] - cheapest["total_usd"]
        placed = next(e["reason"] for e in got["events"] if e["to"] == "PLACED")
        assert f"meets the deadline for ${premium:.2f} more than the cheapest" in placed
        (expl,) = b.sql("SELECT explanation FROM decision_records WHERE job_id = :j", j=urgent)
        assert f"meets the deadline for ${premium:.2f} more than the cheapest" in expl.explanation
    b.close()


# ------------------------------------------------------------------------------------------ queues


def _run_one_of(b: Broker, ns_ids: list[tuple[str, str]]) -> str:
    """One cycle on a 2-vCPU pool where each job takes the whole host: the job that runs went first."""
    b.scheduler.run_cycle()
    running = [j for _, j in ns_ids if b.state(j) == "RUNNING"]
    assert len(running) == 1, {j: b.state(j) for _, j in ns_ids}
    return running[0]


@pytest.mark.parametrize(("discipline", "first"), [
    ("fifo", "old-low"), ("priority", "new-high"), ("default", "new-high"),
], ids=["fifo runs the older job first whatever its priority",
        "priority runs the higher priority first", "default is priority, then deadline, then age"])
def test_a_namespace_queue_discipline_orders_its_jobs(broker: Broker, discipline: str, first: str) -> None:
    ns = broker.tenant()
    r = broker.client.put(f"/v1/namespaces/{ns}/queue", json={"discipline": discipline}, headers=ADMIN_H)
    assert r.status_code == 200 and r.json()["discipline"] == discipline and r.json()["configured"]
    sleep = ["sleep", "30"]
    (old,) = broker.submit(ns, job_doc("old-low", cpu="2", providers=["onprem"], command=sleep, priority=1))
    (new,) = broker.submit(ns, job_doc("new-high", cpu="2", providers=["onprem"], command=sleep, priority=9))
    ran = _run_one_of(broker, [(ns, old), (ns, new)])
    assert ran == {"old-low": old, "new-high": new}[first]


def test_queue_settings_refuse_bad_values(broker: Broker) -> None:
    ns = broker.tenant()
    bad = broker.client.put(f"/v1/namespaces/{ns}/queue", json={"discipline": "lifo"}, headers=ADMIN_H)
    assert bad.status_code == 422 and bad.json()["field"] == "discipline" and "fair-share" in bad.json()["detail"]
    neg = broker.client.put(f"/v1/namespaces/{ns}/queue", json={"weight": -1}, headers=ADMIN_H)
    assert neg.status_code == 422
    hl = broker.client.put(f"/v1/namespaces/{ns}/queue", json={"halfLifeSeconds": 60}, headers=ADMIN_H)
    assert hl.status_code == 422 and hl.json()["field"] == "halfLifeSeconds"
    assert broker.client.put("/v1/queue", json={"weight": 2}, headers=ADMIN_H).status_code == 422
    token = broker.client.post(f"/v1/namespaces/{ns}/tokens", headers=ADMIN_H).json()["token"]
    mine = {"Authorization": f"Bearer {token}"}
    assert broker.client.put(f"/v1/namespaces/{ns}/queue", json={"weight": 2}, headers=mine).status_code == 403
    assert broker.client.get(f"/v1/namespaces/{ns}/queue", headers=mine).status_code == 200


def test_fair_share_is_fed_by_finished_runs_and_serves_the_lighter_namespace_first(broker: Broker) -> None:
    heavy, light = broker.tenant(), broker.tenant()
    r = broker.client.put("/v1/queue", json={"discipline": "fair-share", "halfLifeSeconds": 86400},
                          headers=ADMIN_H)
    assert r.status_code == 200 and r.json()["discipline"] == "fair-share"
    # heavy uses 8 vCPU for 2 h on aws (dry-run: it ends on the clock)
    (used,) = broker.submit(heavy, job_doc("big", cpu="8", memory="16Gi", providers=["aws"], hours=2))
    broker.scheduler.run_cycle()
    broker.clock.advance(2 * 3600 + 5)  # type: ignore[attr-defined]
    broker.scheduler.run_cycle()
    assert broker.state(used) == "SUCCEEDED"
    status = broker.client.get(f"/v1/namespaces/{heavy}/queue", headers=ADMIN_H).json()
    assert status["usage"]["cpu_hours"] == pytest.approx(8 * (2 + 5 / 3600), rel=1e-3)
    assert status["dominantShare"]["share"] > 0
    sleep = ["sleep", "30"]
    (older,) = broker.submit(heavy, job_doc("h", cpu="2", providers=["onprem"], command=sleep))
    (newer,) = broker.submit(light, job_doc("l", cpu="2", providers=["onprem"], command=sleep))
    assert _run_one_of(broker, [(heavy, older), (light, newer)]) == newer, "lower dominant share goes first"
    # the half-life is applied from the stored time: two days later the usage is a quarter
    broker.clock.advance(2 * 86400)  # type: ignore[attr-defined]
    later = broker.client.get(f"/v1/namespaces/{heavy}/queue", headers=ADMIN_H).json()
    assert later["usage"]["cpu_hours"] == pytest.approx(status["usage"]["cpu_hours"] / 4, rel=1e-3)


# ------------------------------------------------------------------------------------------ outcomes


def test_a_finished_run_records_its_outcome_spend_and_usage_with_the_terminal_transition(broker: Broker) -> None:
    ns = broker.tenant()
    (job,) = broker.submit(ns, job_doc("o", cpu="4", memory="8Gi", providers=["aws"], hours=1))
    broker.scheduler.run_cycle()
    estimate = broker.get(ns, job)["cost"]["total_usd"]
    broker.clock.advance(2 * 3600)  # type: ignore[attr-defined]  # it ran 2 h (dry-run ends at 1 h; polled later)
    broker.scheduler.run_cycle()
    assert broker.state(job) == "SUCCEEDED"
    (rec,) = broker.sql("SELECT runtime_hours, actual_cost_usd FROM decision_records WHERE job_id = :j", j=job)
    assert rec.runtime_hours == pytest.approx(2.0, rel=1e-6) and rec.actual_cost_usd == pytest.approx(2 * estimate,
                                                                                                     rel=1e-3)
    (ledger,) = broker.sql("SELECT usd, kind FROM policy_spend WHERE job_id = :j", j=job)
    assert ledger.kind == "actual" and ledger.usd == pytest.approx(rec.actual_cost_usd - estimate, rel=1e-6)
    burn = broker.client.get(f"/v1/namespaces/{ns}/budget", headers=ADMIN_H).json()["burn"]
    assert burn["today_usd"] == pytest.approx(rec.actual_cost_usd, rel=1e-6), "budgets burn the actual cost"
    (usage,) = broker.sql("SELECT cpu_hours, usd FROM fair_share_usage WHERE namespace = :n", n=ns)
    assert usage.cpu_hours == pytest.approx(8.0, rel=1e-6) and usage.usd == pytest.approx(rec.actual_cost_usd)


# ------------------------------------------------------------------------------------------ preemption


def _counter_job(name: str, ckpt: Path, *, target: int, step: float, interval: float) -> dict[str, Any]:
    """examples/preemption/checkpoint-counter.yaml with its script found through HB_EXAMPLES_DIR (an absolute path
    computed here), a private checkpoint path and a short run."""
    doc = yaml.safe_load((EXAMPLES / "checkpoint-counter.yaml").read_text())
    spec = doc["spec"]
    spec["command"] = spec["command"][:4] + ["--target", str(target), "--step-seconds", str(step),
                                             "--interval-seconds", str(interval)]
    spec["env"] = {"HB_EXAMPLES_DIR": str(EXAMPLES)}
    spec["checkpoint"] = {"path": str(ckpt), "intervalMinutes": interval / 60}
    doc["metadata"] = {"name": name}
    return doc  # type: ignore[no-any-return]


@pytest.mark.slow
def test_preemption_checkpoints_requeues_and_resumes_the_counter(tmp_path: Path, store_url: str) -> None:
    one_cpu = dict(LOCAL_2CPU, vcpus=1)
    b = Broker(tmp_path, store_url, clock=SystemClock(), hosts=[one_cpu], grace_seconds=5.0)
    target, step, interval = 60, 0.05, 0.5  # 3 s of counting, a checkpoint every 0.5 s (10 steps)
    for _ in b.start():
        ns = b.tenant()
        b.apply(priority_class("low", 10), priority_class("high", 1000))
        ckpt = tmp_path / "ckpt"
        (counter,) = b.submit(ns, _counter_job("counter", ckpt, target=target, step=step, interval=interval))
        b.until([counter], {"RUNNING"})
        deadline = time.monotonic() + 10
        while not (ckpt / "state.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (ckpt / "state.json").exists(), "the counter checkpointed once before it is preempted"
        urgent_doc = job_doc("urgent", providers=["onprem"], command=["sleep", "1"], priorityClassName="high",
                             resources={"requests": {"cpu": "1", "memory": "256Mi"}})
        (urgent,) = b.submit(ns, urgent_doc)
        report = b.scheduler.run_cycle()
        assert report.preempted == 1
        assert b.state(urgent) in ("RUNNING", "SUCCEEDED")
        preempted = b.get(ns, counter)
        assert preempted["state"] in ("PENDING", "PLACED", "PROVISIONING", "RUNNING")
        requeue = next(e for e in preempted["events"] if e["from"] == "RUNNING" and e["to"] == "PENDING")
        assert requeue["reason"].startswith(f"Preempted by {urgent} (urgent, priority 1000 > 10)")
        b.until([urgent], {"SUCCEEDED"})
        b.until([counter], {"SUCCEEDED"}, seconds=15)
        result = json.loads((ckpt / "result.json").read_text())
        assert result["count"] == target and result["sum"] == target * (target + 1) // 2
        runs = [dict(kv.split("=") for kv in line.split()) for line in (ckpt / "runs.log").read_text().splitlines()]
        assert [r["reason"] for r in runs] == ["preempted", "done"]
        assert runs[1]["start"] == runs[0]["end"], "the second run resumed where the first checkpointed"
        done = sum(int(r["end"]) - int(r["start"]) for r in runs)
        assert done - target <= interval / step, "at most one checkpoint interval of work is lost"
        (rid,) = b.sql("SELECT request_id FROM jobs WHERE id = :j", j=counter)
        assert rid.request_id == f"{counter}-r00001", "the run after the preemption is a new provider request"
        path = [e["to"] for e in b.get(ns, counter)["events"] if e["from"] != e["to"]]
        assert path == ["PENDING", "PLACED", "PROVISIONING", "RUNNING", "PENDING", "PLACED", "PROVISIONING",
                        "RUNNING", "SUCCEEDED"]
    b.close()
