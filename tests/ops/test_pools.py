"""A broker-owned pool on the real store: a stored Pool scales out when its namespace's running work
passes 70 % of its vCPU and on queue length, in at 30 % after the stabilization window, through a real
in-memory provider; bad pool documents are a 422 and change nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from broker.clock import ManualClock
from broker.lifecycle import submit_jobs
from broker.spec import parse_job_spec
from broker.store import JobRow, NamespaceRow
from providers.fake import FakeProvider
from tests.broker.service_support import ADMIN_H, job_doc, make_app, serve_in_thread

POOL = """
kind: Pool
spec:
  namespace: team
  provider: aws
  region: us-east-1
  instanceType: {name: m7i.2xlarge, vcpus: 8, memoryGiB: 32, hourlyUSD: 0.4032}
  minReplicas: 1
  maxReplicas: 6
  cooldownSeconds: 0
  stabilizationWindowSeconds: 300
  queueLengthPerReplica: 4
"""


def _running(store: Any, clock: ManualClock, n: int, cpu: int) -> list[str]:
    """``n`` RUNNING jobs of ``cpu`` vCPU each in namespace team on aws:us-east-1."""
    t = JobRow.__table__  # type: ignore[attr-defined]
    docs = [job_doc(f"j{i}", cpu=str(cpu)) for i in range(n)]
    with store.tx() as session:
        if not session.get(NamespaceRow, "team"):
            session.add(NamespaceRow(name="team", created_at=clock.now()))
            session.flush()
        out = submit_jobs(session, "team", [parse_job_spec(d, now=clock.now()) for d in docs], now=clock.now(),
                          spec_docs=[str(d) for d in docs])
        ids = [o["id"] for o in out]
        session.execute(sa.update(t).where(t.c.id.in_(ids)).values(state="RUNNING", provider="aws",
                                                                    region="us-east-1"))
    return ids


def test_a_pool_scales_out_at_70_and_in_at_30_percent(tmp_path: Path) -> None:
    clock = ManualClock()
    aws = FakeProvider("aws")
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'p.db'}", clock=clock,
                   providers={"aws": aws})
    hb = app.state.hb
    scaler = hb.ops.autoscaler
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        r = c.put("/v1/ops/pools/warm", content=POOL, headers=ADMIN_H)
        assert r.status_code == 200, r.text
        bad = c.put("/v1/ops/pools/warm", content=POOL.replace("maxReplicas: 6", "maxReplicas: -1"), headers=ADMIN_H)
        assert bad.status_code == 422 and "spec.maxReplicas" in bad.json()["detail"]
        (d,) = scaler.reconcile(clock.now())
        assert d["to"] == 1 and len(aws.running()) == 1  # minReplicas
        ids = _running(hb.store, clock, 5, cpu=1)  # 5 of 8 vCPU: 62 %, inside the band
        clock.advance(60)
        assert scaler.reconcile(clock.now())[0]["to"] == 1
        ids += _running(hb.store, clock, 1, cpu=1)  # 6 of 8: 75 % -> ceil(1 * 0.75 / 0.5) = 2
        clock.advance(60)
        (d,) = scaler.reconcile(clock.now())
        assert d["to"] == 2 and "cpu 75%" in d["reason"] and len(aws.running()) == 2

        t = JobRow.__table__  # type: ignore[attr-defined]
        with hb.store.tx() as session:  # the work ends: 1 of 16 vCPU busy
            session.execute(sa.update(t).where(t.c.id.in_(ids[1:])).values(state="SUCCEEDED"))
        clock.advance(60)
        assert scaler.reconcile(clock.now())[0]["to"] == 2  # held by the 300 s stabilization window
        clock.advance(301)
        (d,) = scaler.reconcile(clock.now())
        assert d["to"] == 1 and len(aws.running()) == 1

        docs = [job_doc(f"q{i}") for i in range(17)]  # a queue of 17 at 4 per replica -> 5 replicas
        with hb.store.tx() as session:
            submit_jobs(session, "team", [parse_job_spec(x, now=clock.now()) for x in docs], now=clock.now(),
                        spec_docs=[str(x) for x in docs])
        clock.advance(60)
        (d,) = scaler.reconcile(clock.now())
        assert d["to"] == 5 and "queue_length" in d["reason"] and len(aws.running()) == 5
        (p,) = c.get("/v1/ops/pools", headers=ADMIN_H).json()["items"]
        assert p["desired"] == 5 and len(p["instances"]) == 5 and "queue_length" in p["last_decision"]
    metrics = hb.metrics.render().decode()
    assert 'hb_pool_replicas{kind="current",pool="warm"} 5.0' in metrics
