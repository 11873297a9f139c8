"""Issue 17, tenants and replicas: a namespace token names only the PriorityClasses its namespace is allowed and
cannot raise its priority, a preemption never names another namespace's job, and cancel / logs through a replica
that is not the scheduler leader act on the run the leader started: two apps on one data directory (one
machine), and two ``broker serve`` processes with separate data directories (two machines). Real uvicorn;
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from broker.model import InstanceState
from tests.broker.service_support import ADMIN_H, job_doc, make_app, serve_in_thread, write_inventory


def _tenant(client: httpx.Client, ns: str) -> dict[str, str]:
    assert client.post("/v1/namespaces", json={"name": ns}, headers=ADMIN_H).status_code == 201
    r = client.post(f"/v1/namespaces/{ns}/tokens", headers=ADMIN_H)
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def _cycles_until(app, client: httpx.Client, ns: str, job_id: str, states: set[str], seconds: float = 20) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        app.state.hb.scheduler.run_cycle()
        job = client.get(f"/v1/namespaces/{ns}/jobs/{job_id}", headers=ADMIN_H).json()
        if job["state"] in states or time.monotonic() > deadline:
            return job
        time.sleep(0.05)


CLASSES = """\
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: urgent}
value: 1000
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: batch}
value: -10
"""


def _apply(client: httpx.Client, text: str) -> httpx.Response:
    return client.post("/v1/policies:apply", headers=ADMIN_H | {"Content-Type": "application/yaml"}, content=text)


def test_a_tenant_uses_only_the_priority_classes_allowed_to_its_namespace(tmp_path: Path, store_url: str) -> None:
    app = make_app(tmp_path, store_url)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        a_h, b_h = _tenant(client, "team-a"), _tenant(client, "team-b")
        assert _apply(client, CLASSES).status_code == 200
        jobs_b = "/v1/namespaces/team-b/jobs"
        # no allow-list: only classes at or below the default priority (0 here)
        assert client.get("/v1/namespaces/team-b/priorityclasses", headers=b_h).json() == {
            "namespace": "team-b", "allowList": None, "defaultValue": 0,
            "usable": [{"name": "batch", "value": -10, "preemptionPolicy": "PreemptLowerPriority"}]}
        refused = client.post(jobs_b, headers=b_h, json=job_doc("u", priorityClassName="urgent"))
        assert refused.status_code == 403 and refused.json()["field"] == "spec.priorityClassName", refused.text
        assert refused.json()["detail"].startswith("spec.priorityClassName: PriorityClassNotAllowed: namespace "
                                                   "'team-b' may not use priorityClassName 'urgent'")
        assert "broker policies allow team-b urgent" in refused.json()["detail"]
        assert client.post(jobs_b, headers=b_h, json=job_doc("b", priorityClassName="batch")).status_code == 201
        burst = client.post(jobs_b, headers=b_h, json=[job_doc("ok"), job_doc("u2", priorityClassName="urgent")])
        assert (burst.status_code, burst.json()["field"]) == (403, "[1].spec.priorityClassName")
        # the admin grants `urgent` to team-b only: by the policy document (broker apply) ...
        granted = _apply(client, "apiVersion: hybrid-broker/v1\nkind: AllowedPriorityClasses\n"
                                 "metadata: {name: allowed, namespace: team-b}\nspec: {priorityClassNames: [urgent]}\n")
        assert granted.json()["applied"] == [{"kind": "AllowedPriorityClasses", "name": "team-b",
                                              "namespace": "team-b", "action": "created"}], granted.text
        urgent = client.post(jobs_b, headers=b_h, json=job_doc("u", priorityClassName="urgent"))
        assert urgent.json()["priority"] == 1000, urgent.text
        assert client.post(jobs_b, headers=b_h, json=job_doc("b", priorityClassName="batch")).status_code == 403, \
            "with a list, a class off the list is refused even below the default"
        assert client.post("/v1/namespaces/team-a/jobs", headers=a_h,
                           json=job_doc("u", priorityClassName="urgent")).status_code == 403, "team-a was not granted"
        # ... or by the API; a namespace token can neither read another's nor set its own
        assert client.get("/v1/namespaces/team-b/priorityclasses", headers=a_h).status_code == 404
        assert client.put("/v1/namespaces/team-a/priorityclasses", headers=a_h,
                          json={"priorityClassNames": ["urgent"]}).status_code == 403
        put = client.put("/v1/namespaces/team-a/priorityclasses", headers=ADMIN_H,
                         json={"priorityClassNames": ["urgent", "urgent"]})
        assert put.json()["allowList"] == ["urgent"] and [c["name"] for c in put.json()["usable"]] == ["urgent"]
        assert client.post("/v1/namespaces/team-a/jobs", headers=a_h,
                           json=job_doc("u", priorityClassName="urgent")).status_code == 201
        bad = client.put("/v1/namespaces/team-a/priorityclasses", headers=ADMIN_H, json={"priorityClassNames": [""]})
        assert bad.status_code == 422 and bad.json()["field"] == "priorityClassNames[0]"
        nowhere = _apply(client, "apiVersion: hybrid-broker/v1\nkind: AllowedPriorityClasses\n"
                                 "metadata: {namespace: team-x}\nspec: {priorityClassNames: [urgent]}\n")
        assert nowhere.status_code == 422 and nowhere.json()["field"] == "items[0].metadata.namespace"
        reset = client.delete("/v1/namespaces/team-a/priorityclasses", headers=ADMIN_H)
        assert reset.json()["allowList"] is None
        assert client.post("/v1/namespaces/team-a/jobs", headers=a_h,
                           json=job_doc("u", priorityClassName="urgent")).status_code == 403
        # the admin token is not limited by any list
        assert client.post(jobs_b, headers=ADMIN_H, json=job_doc("a", priorityClassName="batch")).status_code == 201


def test_a_tenant_cannot_raise_its_priority_and_a_preemption_never_names_another_namespace(tmp_path: Path) -> None:
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'broker.db'}")
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        a_h, b_h = _tenant(client, "team-a"), _tenant(client, "team-b")
        big = client.post("/v1/namespaces/team-b/jobs", headers=b_h,
                          json=job_doc("greedy", providers=["onprem"], priority=1_000_000_000))
        assert big.status_code == 422 and big.json()["field"] == "spec.priority", big.text
        assert "priorityClassName" in big.json()["detail"]
        lower = client.post("/v1/namespaces/team-b/jobs", headers=b_h, json=job_doc("nice", priority=-5))
        assert lower.status_code == 201, "lowering one's own priority is allowed"
        client.delete(f"/v1/namespaces/team-b/jobs/{lower.json()['id']}", headers=b_h)
        # a class the admin allowed to team-b still preempts across namespaces; the victim learns nothing of who
        assert _apply(client, CLASSES).status_code == 200
        assert client.put("/v1/namespaces/team-b/priorityclasses", headers=ADMIN_H,
                          json={"priorityClassNames": ["urgent"]}).status_code == 200
        victim = client.post("/v1/namespaces/team-a/jobs", headers=a_h,
                             json=job_doc("victim", cpu="2", providers=["onprem"], command=["sleep", "30"])).json()
        assert _cycles_until(app, client, "team-a", victim["id"], {"RUNNING"})["state"] == "RUNNING"
        urgent = client.post("/v1/namespaces/team-b/jobs", headers=b_h,
                             json=job_doc("secret-project", cpu="2", providers=["onprem"], command=["true"],
                                          priorityClassName="urgent"))
        assert urgent.status_code == 201, urgent.text
        app.state.hb.scheduler.run_cycle()
        seen = client.get(f"/v1/namespaces/team-a/jobs/{victim['id']}", headers=a_h).json()
        requeue = next(e for e in seen["events"] if e["from"] == "RUNNING" and e["to"] == "PENDING")
        assert requeue["reason"].startswith("Preempted by a job of another namespace (priority 1000 > 0)")
        text = str(seen)
        assert urgent.json()["id"] not in text and "secret-project" not in text
        preemptor = str(client.get(f"/v1/namespaces/team-b/jobs/{urgent.json()['id']}", headers=b_h).json())
        assert "1 job(s) of other namespaces" in preemptor, preemptor
        assert victim["id"] not in preemptor and "victim" not in preemptor and "team-a" not in preemptor
        pool = app.state.hb.providers["onprem"]
        for inst in pool.instances():
            pool.signal(inst.id, 9)


def test_cancel_and_logs_through_a_replica_that_is_not_the_leader(tmp_path: Path, store_url: str) -> None:
    leader, replica = make_app(tmp_path, store_url), make_app(tmp_path, store_url)
    with serve_in_thread(replica) as url, httpx.Client(base_url=url, headers=ADMIN_H, timeout=30) as client:
        job = client.post("/v1/namespaces/default/jobs", json=job_doc(
            "long", providers=["onprem"], command=["sh", "-c", "echo hello-from-the-leader; sleep 30"])).json()
        running = _cycles_until(leader, client, "default", job["id"], {"RUNNING"})
        assert running["state"] == "RUNNING"
        (iid,) = [i["id"] for i in running["instances"]]
        out = leader.state.hb.providers["onprem"].logs(iid)[0]
        deadline = time.monotonic() + 10
        while not out.exists() or not out.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        logs = client.get(f"/v1/namespaces/default/jobs/{job['id']}/logs")
        assert (logs.status_code, logs.text) == (200, "hello-from-the-leader\n")
        cancelled = client.delete(f"/v1/namespaces/default/jobs/{job['id']}")
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "CANCELLED"
    # the run the leader started is really stopped, not just marked
    assert leader.state.hb.providers["onprem"].instance(iid).state is not InstanceState.RUNNING


def _until(probe, seconds: float = 30.0):
    """Call ``probe`` until it returns something truthy (bounded); returns that."""
    deadline = time.monotonic() + seconds
    while True:
        got = probe()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


@pytest.mark.network
def test_cancel_and_logs_through_a_replica_on_another_machine(tmp_path: Path) -> None:
    """Two ``broker serve`` processes on one PostgreSQL with separate data directories (two machines: no shared
    process table entry or file is used): the job runs on the leader; the other replica serves its real output
    and its cancel stops it before the job reads CANCELLED."""
    from providers.onprem import _proc_start_ticks
    from tests.broker.replica_support import ADMIN_H as REP_H
    from tests.broker.replica_support import EnvSide, Replica, pg_database, prepare_database, stop_all

    with pg_database() as url:
        if url is None:
            pytest.skip("PostgreSQL is not reachable")
        prepare_database(url)
        env = {"BROKER_PROVIDERS": "onprem", "BROKER_ONPREM_SANDBOX": "off",
               "BROKER_INVENTORY": str(write_inventory(tmp_path))}
        replicas = [Replica(n, tmp_path, url, EnvSide(env)) for n in ("machine-a", "machine-b")]
        try:
            for r in replicas:
                r.start()
            for r in replicas:
                r.wait_ready()
            assert _until(lambda: sum(r.leader_lines() for r in replicas)), replicas[0].log.read_text()[-2000:]
            leader, other = sorted(replicas, key=lambda r: -r.leader_lines())
            with httpx.Client(base_url=other.url, headers=REP_H, timeout=30) as b:
                job = b.post("/v1/namespaces/default/jobs", json=job_doc(
                    "long", providers=["onprem"],
                    command=["sh", "-c", "echo hello-from-machine-a; echo oops >&2; sleep 120"])).json()
                path = f"/v1/namespaces/default/jobs/{job['id']}"
                running = _until(lambda: (j := b.get(path).json())["state"] == "RUNNING" and j)
                assert running, b.get(path).json()
                (iid,) = [i["id"] for i in running["instances"]]
                run = json.loads((leader.data / "runs" / iid / "run.json").read_text())
                assert not (other.data / "runs" / iid).exists(), "the replicas share no files"
                # logs: never an empty 200; once the leader stored the tail, the real output
                seen = []

                def logs() -> httpx.Response | None:
                    r = b.get(f"{path}/logs")
                    seen.append(r.status_code)
                    assert r.status_code in (200, 503), r.text
                    assert r.status_code == 503 or r.text, "a 200 is never empty while the output exists"
                    return r if r.status_code == 200 else None

                out = _until(logs)
                assert out is not None and out.text == "hello-from-machine-a\n", seen
                assert out.headers["x-log-source"] == "stored" and out.headers["x-log-ended"] == "false"
                err = b.get(f"{path}/logs", params={"stream": "stderr"})
                assert (err.status_code, err.text) == (200, "oops\n")
                # cancel through machine-b: recorded (202), the run still going; machine-a stops it
                cancel = b.delete(path)
                assert cancel.status_code == 202, cancel.text
                assert cancel.json()["state"] == "RUNNING" and cancel.json()["cancel_requested_at"]
                ended = _until(lambda: (j := b.get(path).json())["state"] == "CANCELLED" and j)
                assert ended, b.get(path).json()
                assert _proc_start_ticks(run["pid"]) != run["start_ticks"], "CANCELLED only once the run stopped"
                assert "requested through another replica" in ended["events"][-1]["reason"]
                final = b.get(f"{path}/logs")
                assert (final.status_code, final.text) == (200, "hello-from-machine-a\n")
                assert final.headers["x-log-ended"] == "true"
                assert b.delete(path).status_code == 409
        finally:
            stop_all(replicas)


def test_a_replica_without_the_run_answers_503_then_the_stored_tail_202_to_a_cancel_and_404_without_logs(
    tmp_path: Path, store_url: str
) -> None:
    """Two apps on one store with separate data directories (in one process, driven cycle by cycle)."""
    import sqlalchemy as sa

    from broker.job_logs import carry_out_cancels
    from broker.store import JobLogTailRow

    leader = make_app(tmp_path, store_url)
    (tmp_path / "b").mkdir()
    other = make_app(tmp_path / "b", store_url)
    with serve_in_thread(other) as url, httpx.Client(base_url=url, headers=ADMIN_H, timeout=30) as b:
        go = tmp_path / "go"  # the run writes its first line only once told (a capture must not race it)
        job = b.post("/v1/namespaces/default/jobs", json=job_doc(
            "long", providers=["onprem"],
            command=["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; echo first-line; sleep 30"])).json()
        path = f"/v1/namespaces/default/jobs/{job['id']}"
        running = _cycles_until(leader, b, "default", job["id"], {"RUNNING"})
        (iid,) = [i["id"] for i in running["instances"]]
        early = b.get(f"{path}/logs")
        assert early.status_code == 503 and early.headers["retry-after"] == "2", early.text
        assert "ask again" in early.json()["detail"]
        go.touch()
        out = leader.state.hb.providers["onprem"].logs(iid)[0]
        assert _until(lambda: out.exists() and out.read_text()), "the run wrote its first line"
        leader.state.hb.scheduler.run_cycle()  # the leader's poll stores the tail
        stored = b.get(f"{path}/logs")
        assert (stored.status_code, stored.text, stored.headers["x-log-source"]) == (200, "first-line\n", "stored")
        assert int(stored.headers["x-log-size"]) == len("first-line\n")
        pending = b.delete(path)
        assert (pending.status_code, pending.json()["state"]) == (202, "RUNNING")
        assert b.delete(path).status_code == 202, "asking again is harmless"
        assert leader.state.hb.providers["onprem"].instance(iid).state is InstanceState.RUNNING
        assert carry_out_cancels(other.state.hb, leader=True) == 0, "a replica cannot stop another machine's run"
        report = leader.state.hb.scheduler.run_cycle()
        assert report.cancelled == 1
        assert leader.state.hb.providers["onprem"].instance(iid).state is not InstanceState.RUNNING
        assert b.get(path).json()["state"] == "CANCELLED"
        assert b.get(f"{path}/logs").headers["x-log-ended"] == "true"
        # the replica whose pool runs a job carries its cancel out even when it no longer leads
        second = b.post("/v1/namespaces/default/jobs", json=job_doc(
            "second", providers=["onprem"], command=["sleep", "30"])).json()
        (iid2,) = [i["id"] for i in _cycles_until(leader, b, "default", second["id"], {"RUNNING"})["instances"]]
        assert b.delete(f"/v1/namespaces/default/jobs/{second['id']}").status_code == 202
        assert carry_out_cancels(leader.state.hb, leader=False) == 1
        assert leader.state.hb.providers["onprem"].instance(iid2).state is not InstanceState.RUNNING
        assert b.get(f"/v1/namespaces/default/jobs/{second['id']}").json()["state"] == "CANCELLED"
        tails = JobLogTailRow.__table__  # type: ignore[attr-defined]
        with leader.state.hb.store.tx() as session:
            session.execute(sa.delete(tails).where(tails.c.job_id == job["id"]))
        gone = b.get(f"{path}/logs")
        assert gone.status_code == 404 and "no log" in gone.json()["detail"], gone.text
