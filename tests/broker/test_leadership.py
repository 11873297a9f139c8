"""Issue 17: one scheduler leader at a time on PostgreSQL, fenced writes, and no job run twice when the
database restarts under two replicas (a private PostgreSQL cluster, really restarted)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from broker.leader import FencedOut, Leadership
from broker.lifecycle import submit_jobs
from broker.migrations import upgrade
from broker.scheduler import LEADER_LOCK_ID
from broker.spec import parse_job_spec
from broker.store import JobRow, Store
from tests.broker.pg_cluster import PgCluster
from tests.broker.service_support import job_doc, make_app
from tests.conftest import pg_schema

pytestmark = pytest.mark.network


def _until_backend_gone(conn: sa.Connection, pid: int | None, seconds: float = 10.0) -> None:
    """Wait (bounded) until backend ``pid`` has exited and so released its advisory locks."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))  # the view is cached per transaction
        alive = conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).scalar()
        if not alive:
            return
        time.sleep(0.05)
    raise AssertionError(f"backend {pid} still alive after {seconds} s")


def test_a_leader_whose_lock_session_dies_is_fenced_out_and_its_successor_bumps_the_epoch(
    pg_database: str | None,
) -> None:
    with pg_schema(pg_database) as url:
        a_store, b_store = Store(url), Store(url)
        upgrade(a_store.engine)
        a, b = Leadership(a_store, LEADER_LOCK_ID), Leadership(b_store, LEADER_LOCK_ID)
        try:
            assert a.check() and a.epoch is not None
            assert not b.check(), "the lock is taken: one leader at a time"
            with a_store.tx() as session:
                a.fence(session)  # a's writes go through while it leads
            with a_store.engine.connect() as admin:  # what a database restart does to a's lock session
                admin.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": a.backend_pid})
                _until_backend_gone(admin, a.backend_pid)  # terminate only signals; the lock goes with the exit
            assert b.check() and b.epoch == a.epoch + 1
            with pytest.raises(FencedOut, match="ended"), a_store.tx() as session:
                a.fence(session)  # a still believes it leads, until it asks
            assert not a.check(), "a sees its lock is gone (b holds it now)"
            with pytest.raises(FencedOut), a_store.tx() as session:
                a.fence(session)
        finally:
            a.release()
            b.release()
            a_store.dispose()
            b_store.dispose()


def _submit(app, docs: list[dict]) -> list[str]:
    hb = app.state.hb
    now = hb.clock.now()
    specs = [parse_job_spec(d, now=now) for d in docs]
    with hb.store.tx() as session:
        jobs = submit_jobs(session, "default", specs, now=now, spec_docs=[json.dumps(s.raw) for s in specs])
    return [j["id"] for j in jobs]


def _states(app, ids: list[str]) -> dict[str, str]:
    jobs = JobRow.__table__  # type: ignore[attr-defined]
    while True:
        try:
            with app.state.hb.store.read() as session:
                rows = session.execute(sa.select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(ids)))
                return {r.id: r.state for r in rows}
        except sa.exc.OperationalError:  # the database is restarting
            time.sleep(0.1)


@pytest.mark.slow
def test_two_replicas_with_the_database_restarted_mid_run_never_run_a_job_twice(
    tmp_path: Path, pg_cluster: PgCluster
) -> None:
    cluster = pg_cluster
    url = cluster.new_database()
    starts = tmp_path / "starts.txt"
    cmd = ["sh", "-c", f'echo "$HB_JOB" >> {starts}; sleep 1.5']
    apps = [make_app(tmp_path, url, scheduler_interval_seconds=0.1) for _ in range(2)]
    stops = [threading.Event() for _ in apps]
    threads = [threading.Thread(target=a.state.hb.scheduler.run_forever, args=(s,), daemon=True)
               for a, s in zip(apps, stops, strict=True)]
    docs = [job_doc(f"j{i}", cpu="0.25", memory="128Mi", command=cmd, providers=["onprem"]) for i in range(8)]
    try:
        ids = _submit(apps[0], docs[:4])
        threads[0].start()
        deadline = time.monotonic() + 20
        while "RUNNING" not in _states(apps[0], ids).values():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        threads[1].start()
        ids += _submit(apps[0], docs[4:])
        for _ in range(3):  # restart the database under both replicas, three times, while jobs run
            time.sleep(0.4)
            cluster.restart()
            cluster.wait_up()
        deadline = time.monotonic() + 40
        while set(_states(apps[0], ids).values()) != {"SUCCEEDED"}:
            assert time.monotonic() < deadline, _states(apps[0], ids)
            time.sleep(0.1)
        runs = Counter(starts.read_text().split())
        assert runs == Counter({i: 1 for i in ids}), "every job ran exactly once"
        with apps[0].state.hb.store.read() as session:
            epoch = session.execute(sa.text("SELECT epoch FROM leader_epochs WHERE name = 'scheduler'")).scalar()
        assert epoch >= 2, "leadership was won anew after the restarts"
    finally:
        for s in stops:
            s.set()
        for t in threads:
            if t.is_alive():
                t.join(30)
        for a in apps:
            for inst in a.state.hb.providers["onprem"].instances():
                a.state.hb.providers["onprem"].signal(inst.id, 9)
            a.state.hb.store.dispose()
