"""Health (issue 14): a lost host's job resumes on another host from its checkpoint and completes once; a
failing liveness probe (a real HTTP server) restarts the job; readiness and exec/TCP probes; bad probe
specs are a 422 naming the field. Real processes on real on-prem hosts, simulated time for the broker."""

from __future__ import annotations

import json
import socket
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from broker.clock import ManualClock
from broker.ops.health import record_heartbeat
from broker.ops.probes import parse_probe, run_probe
from broker.store import JobEventRow, JobRow
from tests.broker.service_support import ADMIN_H, job_doc, make_app, serve_in_thread

TWO_HOSTS = """\
sites:
  - {name: local, continent: eu, uplink_gbps: 1}
hosts:
  - {name: host-a, site: local, vcpus: 2, memory_gib: 4, gpus: 0, owned_usd_per_hour: 0, local: true}
  - {name: host-b, site: local, vcpus: 2, memory_gib: 4, gpus: 0, owned_usd_per_hour: 0, local: true}
"""

# Counts to 10 checkpointing every step; a first run (no checkpoint) stops at step 5 and hangs there, as
# a run on a host that dies would. The finishing run appends one line to <out>/completions.
WORKER = textwrap.dedent("""\
    import os, pathlib, sys, time
    ck = pathlib.Path(os.environ["HB_CHECKPOINT_DIR"]); ck.mkdir(parents=True, exist_ok=True)
    out = pathlib.Path(sys.argv[1])
    f = ck / "step"
    step = start = int(f.read_text()) if f.exists() else 0
    while step < 10:
        if start == 0 and step == 5:
            time.sleep(0.05)
            continue
        step += 1
        f.write_text(str(step))
    with open(out / "completions", "a") as c:
        c.write(f"{os.environ['HB_INSTANCE_ID']} resumed-from={start}\\n")
""")


def _app(tmp_path: Path, store_url: str, clock: ManualClock) -> Any:
    import pricing
    from broker.app import create_app
    from providers.fake import FakeProvider
    from providers.onprem import OnPremPool
    from tests.broker.service_support import catalog, make_settings

    settings = make_settings(tmp_path, store_url)
    inv_path = tmp_path / "inventory2.yaml"
    inv_path.write_text(TWO_HOSTS)
    inventory = pricing.load_inventory(inv_path)
    pool = OnPremPool(inventory, settings.data_dir, clock=clock, grace_seconds=1.0)
    return create_app(settings, clock=clock, providers={"onprem": pool, "aws": FakeProvider("aws")},
                      catalog=catalog(), egress=pricing.load_egress(None, sites=inventory.sites))


def _job(session: Any, job_id: str) -> Any:
    t = JobRow.__table__  # type: ignore[attr-defined]
    return session.execute(sa.select(t).where(t.c.id == job_id)).one()


def _events(session: Any, job_id: str) -> list[Any]:
    t = JobEventRow.__table__  # type: ignore[attr-defined]
    return list(session.execute(sa.select(t).where(t.c.job_id == job_id).order_by(t.c.id)))


def _until(cond: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_lost_hosts_job_resumes_elsewhere_from_its_checkpoint_and_completes_once(tmp_path: Path,
                                                                                   store_url: str) -> None:
    clock = ManualClock()
    app = _app(tmp_path, store_url, clock)
    hb = app.state.hb
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ckpt = tmp_path / "ckpt"
    with hb.store.tx() as session:
        for host in ("host-a", "host-b"):
            record_heartbeat(session, "host", host, clock.now())
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        assert c.post("/v1/namespaces", json={"name": "team"}, headers=ADMIN_H).status_code in (200, 201)
        doc = job_doc("train", cpu="2", command=[sys.executable, str(script), str(out)], providers=["onprem"],
                      checkpoint={"path": str(ckpt), "intervalMinutes": 1})
        r = c.post("/v1/namespaces/team/jobs", json=doc, headers=ADMIN_H)
        assert r.status_code in (200, 201), r.text
        job_id = r.json()["id"]
        sched = hb.scheduler
        sched.run_cycle()
        with hb.store.read() as session:
            first = _job(session, job_id)
        assert first.state == "RUNNING"
        lost = json.loads(first.placement_json)["instance_type"]
        other = "host-b" if lost == "host-a" else "host-a"
        _until(lambda: (ckpt / "step").exists() and (ckpt / "step").read_text() == "5", "the checkpoint at step 5")

        clock.advance(61)  # the host running the job falls silent; the other one keeps beating
        with hb.store.tx() as session:
            record_heartbeat(session, "host", other, clock.now())
        sched.run_cycle()
        with hb.store.read() as session:
            moved = _job(session, job_id)
        assert moved.state == "PENDING" and moved.request_id != first.request_id
        assert lost in hb.providers["onprem"].cordoned
        beats = {b["name"]: b for b in c.get("/v1/ops/heartbeats", headers=ADMIN_H).json()["items"]}
        assert beats[lost]["status"] == "lost" and beats[lost]["epoch"] == 1

        sched.run_cycle()  # placed again: only the other host has room
        with hb.store.read() as session:
            second = _job(session, job_id)
        assert second.state == "RUNNING" and json.loads(second.placement_json)["instance_type"] == other

        def done() -> bool:
            sched.run_cycle()
            with hb.store.read() as session:
                return bool(_job(session, job_id).state == "SUCCEEDED")

        _until(done, "the job to succeed")
        time.sleep(0.3)  # the fenced first run had every chance to finish too
        lines = (out / "completions").read_text().splitlines()
        assert len(lines) == 1 and lines[0].endswith("resumed-from=5")  # from the checkpoint, once
        with hb.store.read() as session:
            events = _events(session, job_id)
        assert [e.to_state for e in events].count("SUCCEEDED") == 1
        fence = next(e for e in events if e.from_state == "RUNNING" and e.to_state == "PENDING")
        assert f"host {lost} lost" in fence.reason
        assert json.loads(fence.data_json)["fenced_request_id"] == first.request_id
        # the fenced run is stopped; the pool may have forgotten an ended run, so read it by id (from disk)
        old = [hb.providers["onprem"].instance(i["id"]) for i in json.loads(first.instances_json)]
        assert old and all(i.state.value == "terminated" for i in old)
        from broker.ops.samples import read_series

        with hb.store.read() as session:  # the ended run's kernel accounting, kept for VPA
            (mem,) = read_series(session, "job_memory_used_gib", selector={"job": "train"})
        assert 0.001 < float(mem.values[-1]) < 4

        clock.advance(5)
        with hb.store.tx() as session:
            record_heartbeat(session, "host", lost, clock.now())
        report = hb.ops.health.check(clock.now())
        assert report.recovered == [f"host/{lost}"] and lost not in hb.providers["onprem"].cordoned
        assert 'hb_failovers_total{reason="host_lost"} 1.0' in hb.metrics.render().decode()


@contextmanager
def _health_server() -> Iterator[tuple[str, int, dict[str, int]]]:
    status = {"code": 200}

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(status["code"])
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield "127.0.0.1", int(server.server_address[1]), status
    finally:
        server.shutdown()
        server.server_close()


def test_a_cancelled_job_on_a_lost_host_ends_cancelled_and_is_never_re_placed(tmp_path: Path) -> None:
    """The cancel of a run on a host that no replica can reach waits (202); when the host is found lost, the
    job ends CANCELLED (its run fenced) instead of being re-placed as a lost host's jobs are."""
    clock = ManualClock()
    app = _app(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", clock)
    hb = app.state.hb
    with hb.store.tx() as session:
        for host in ("host-a", "host-b"):
            record_heartbeat(session, "host", host, clock.now())
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        doc = job_doc("stuck", command=[sys.executable, "-c", "import time; time.sleep(60)"], providers=["onprem"])
        job_id = c.post("/v1/namespaces/default/jobs", json=doc, headers=ADMIN_H).json()["id"]
        hb.scheduler.run_cycle()
        with hb.store.read() as session:
            first = _job(session, job_id)
        assert first.state == "RUNNING"
        lost = json.loads(first.placement_json)["instance_type"]
        other = "host-b" if lost == "host-a" else "host-a"
        with hb.store.tx() as session:  # what a replica that cannot stop the run records (it answers 202)
            session.execute(sa.update(JobRow.__table__).where(JobRow.__table__.c.id == job_id)  # type: ignore[attr-defined]
                            .values(cancel_requested_at=clock.now()))
        clock.advance(61)
        with hb.store.tx() as session:
            record_heartbeat(session, "host", other, clock.now())
        report = hb.ops.health.check(clock.now())
        assert report.replaced == [] and report.lost == [f"host/{lost}"]
        hb.scheduler.run_cycle()
        job = c.get(f"/v1/namespaces/default/jobs/{job_id}", headers=ADMIN_H).json()
        assert job["state"] == "CANCELLED", job["events"]
        moves = [(e["from"], e["to"]) for e in job["events"] if e["from"] != e["to"]]
        assert moves[-1] == ("RUNNING", "CANCELLED") and ("RUNNING", "PENDING") not in moves
        assert f"host {lost} lost" in job["events"][-1]["reason"]
        old = [hb.providers["onprem"].instance(i["id"]) for i in json.loads(first.instances_json)]
        assert old and all(i.state.value == "terminated" for i in old)


def test_a_failing_liveness_probe_restarts_the_job_and_readiness_follows_its_probe(tmp_path: Path) -> None:
    clock = ManualClock()
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'h.db'}", clock=clock)
    hb = app.state.hb
    with _health_server() as (host, port, status), serve_in_thread(app) as url, \
            httpx.Client(base_url=url, timeout=30) as c:
        c.post("/v1/namespaces", json={"name": "svc"}, headers=ADMIN_H)
        probe = {"httpGet": {"host": host, "port": port, "path": "/healthz"}, "periodSeconds": 10,
                 "failureThreshold": 3, "initialDelaySeconds": 5}
        doc = job_doc("web", command=[sys.executable, "-c", "import time; time.sleep(60)"], providers=["onprem"],
                      livenessProbe=probe, readinessProbe={**probe, "failureThreshold": 1})
        job_id = c.post("/v1/namespaces/svc/jobs", json=doc, headers=ADMIN_H).json()["id"]
        sched = hb.scheduler
        sched.run_cycle()
        with hb.store.read() as session:
            first = _job(session, job_id)
        assert first.state == "RUNNING"
        assert hb.ops.health.check(clock.now()).probes_run == 0  # initialDelaySeconds not over
        clock.advance(10)
        assert hb.ops.health.check(clock.now()).probes_run == 2
        assert hb.ops.health.check(clock.now()).probes_run == 0  # periodSeconds not over
        status["code"] = 500
        for n in range(3):
            clock.advance(10)
            report = hb.ops.health.check(clock.now())
            assert report.restarted == ([job_id] if n == 2 else []), n
        from broker.ops.store import ProbeStateRow

        t = ProbeStateRow.__table__  # type: ignore[attr-defined]
        with hb.store.read() as session:
            states = {r.probe: r for r in session.execute(sa.select(t).where(t.c.job_id == job_id))}
            restarted = _job(session, job_id)
        assert states["readiness"].ready is False and states["liveness"].failures == 3
        assert restarted.state == "PENDING" and restarted.request_id != first.request_id
        # the fenced run is stopped; the pool may have forgotten an ended run, so read it by id (from disk)
        old = [hb.providers["onprem"].instance(i["id"]) for i in json.loads(first.instances_json)]
        assert old and all(i.state.value == "terminated" for i in old)
        status["code"] = 200
        sched.run_cycle()
        with hb.store.read() as session:
            assert _job(session, job_id).state == "RUNNING"  # the restart
        hb.providers["onprem"].terminate([i.id for i in hb.providers["onprem"].instances()], "test-cleanup")


def test_restart_policy_never_fails_an_on_prem_job_whose_liveness_probe_fails(tmp_path: Path) -> None:
    """``restartPolicy: Never``: the liveness failure ends the job FAILED (not re-placed), its run stopped,
    charged and its placement record given an outcome, like a run that failed by itself."""
    clock = ManualClock()
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'h.db'}", clock=clock)
    hb = app.state.hb
    with _health_server() as (host, port, status), serve_in_thread(app) as url, \
            httpx.Client(base_url=url, timeout=30) as c:
        c.post("/v1/namespaces", json={"name": "svc"}, headers=ADMIN_H)
        probe = {"httpGet": {"host": host, "port": port, "path": "/healthz"}, "periodSeconds": 10,
                 "failureThreshold": 2}
        doc = job_doc("once", command=[sys.executable, "-c", "import time; time.sleep(60)"], providers=["onprem"],
                      livenessProbe=probe, restartPolicy="Never")
        job_id = c.post("/v1/namespaces/svc/jobs", json=doc, headers=ADMIN_H).json()["id"]
        hb.scheduler.run_cycle()
        with hb.store.read() as session:
            first = _job(session, job_id)
        assert first.state == "RUNNING"
        status["code"] = 503
        reports = []
        for _ in range(2):
            clock.advance(10)
            reports.append(hb.ops.health.check(clock.now()))
        assert [r.failed for r in reports] == [[], [job_id]] and all(r.restarted == [] for r in reports)
        hb.scheduler.run_cycle()  # nothing re-places it
        job = c.get(f"/v1/namespaces/svc/jobs/{job_id}", headers=ADMIN_H).json()
        assert job["state"] == "FAILED" and "restartPolicy: Never" in job["message"], job
        assert [e["to"] for e in job["events"] if e["from"] != e["to"]][-2:] == ["RUNNING", "FAILED"]
        old = [hb.providers["onprem"].instance(i["id"]) for i in json.loads(first.instances_json)]
        assert old and all(i.state.value == "terminated" for i in old)
        from broker.decisions import DecisionRecord

        with hb.store.read() as session:
            rec = session.execute(sa.select(DecisionRecord).where(DecisionRecord.job_id == job_id)).scalars().one()
        assert rec.finished_at is not None and rec.runtime_hours == pytest.approx(20 / 3600)


def test_exec_and_tcp_probes(tmp_path: Path) -> None:
    ok = parse_probe({"exec": {"command": [sys.executable, "-c", "pass"]}}, "p")
    bad = parse_probe({"exec": {"command": [sys.executable, "-c", "raise SystemExit(3)"]}}, "p")
    slow = parse_probe({"exec": {"command": [sys.executable, "-c", "import time; time.sleep(5)"]},
                        "timeoutSeconds": 0.3}, "p")
    assert run_probe(ok).ok and run_probe(bad) .message == "exit code 3"
    assert not run_probe(slow).ok and "timed out" in run_probe(slow).message
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert run_probe(parse_probe({"tcpSocket": {"port": port}}, "p")).ok
    assert not run_probe(parse_probe({"tcpSocket": {"port": port}, "timeoutSeconds": 0.5}, "p")).ok


BAD_PROBES = [
    ({"periodSeconds": 10}, "spec.livenessProbe"),
    ({"exec": {"command": "true"}}, "spec.livenessProbe.exec.command"),
    ({"httpGet": {"port": 70000}}, "spec.livenessProbe.httpGet.port"),
    ({"tcpSocket": {"port": 80}, "failureThreshold": 0}, "spec.livenessProbe.failureThreshold"),
    ({"tcpSocket": {"port": 80}, "periodSecond": 5}, "spec.livenessProbe.periodSecond"),
]


def test_a_bad_probe_spec_is_a_422_naming_the_field(tmp_path: Path) -> None:
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'p.db'}")
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        c.post("/v1/namespaces", json={"name": "svc"}, headers=ADMIN_H)
        for probe, field in BAD_PROBES:
            r = c.post("/v1/namespaces/svc/jobs", json=job_doc(livenessProbe=probe), headers=ADMIN_H)
            assert r.status_code == 422 and field in r.text, r.text
        assert c.get("/v1/namespaces/svc/jobs", headers=ADMIN_H).json()["jobs"] == []
