"""The alert engine on the real store (SQLite and PostgreSQL): ``for:`` takes pending to firing, a cleared
condition resolves, firing alerts are grouped with a root cause, and delivery is a signed webhook to a real
local HTTP server, retried on the clock's schedule. The API refuses bad rules with a 422 and keeps the old."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx
import numpy as np

from broker.clock import ManualClock
from broker.ops.alerts import AlertEngine, list_alerts, put_rules
from broker.ops.samples import Sample, record
from broker.ops.webhooks import SIGNATURE_HEADER, WebhookSender, verify
from tests.broker.service_support import ADMIN_H, make_app, serve_in_thread
from tests.ops.support import webhook_receiver

RULES = """
groups:
  - name: fleet
    rules:
      - alert: HostCpuHigh
        expr: 'utilization{resource="cpu"} > 0.9'
        for: 5m
        severity: critical
"""


def _host(i: int) -> dict[str, str]:
    return {"scope": "host", "provider": "aws", "region": "us-east-1", "pool": "p1", "host": f"h{i}",
            "resource": "cpu"}


def _cpu(store, at, values: dict[int, float]) -> None:  # type: ignore[no-untyped-def]
    with store.tx() as session:
        record(session, [Sample("utilization", _host(i), v, at) for i, v in values.items()])


def test_for_pending_firing_resolved_with_root_cause_and_signed_retried_webhook(tmp_path: Path,
                                                                                 store_url: str) -> None:
    clock = ManualClock()
    app = make_app(tmp_path, store_url, clock=clock)
    store = app.state.hb.store
    with store.tx() as session:
        put_rules(session, "fleet", RULES, clock.now())
    with webhook_receiver(fail_first=2) as rx:
        engine = AlertEngine(store, clock, metrics=app.state.hb.metrics,
                             webhook=WebhookSender(rx.url, "s3cret"), retry_base_seconds=30)
        _cpu(store, clock.now(), {0: 0.95, 1: 0.97, 2: 0.99, 3: 0.2})
        r = engine.evaluate()
        assert (r.findings, r.pending, r.fired) == (3, 3, 0)
        assert engine.deliver() == {"sent": 0, "failed": 0, "gave_up": 0}  # pending alerts are not sent

        clock.advance(300)
        _cpu(store, clock.now(), {0: 0.95, 1: 0.97, 2: 0.99, 3: 0.2})
        r = engine.evaluate()
        assert r.fired == 3
        assert [g["root_cause"] for g in r.groups] == ["provider=aws/region=us-east-1/pool=p1"]
        with store.read() as session:
            firing = list_alerts(session, state="firing")
        assert {a["labels"]["host"] for a in firing} == {"h0", "h1", "h2"}
        assert all(a["root_cause"].startswith("provider=aws/region=us-east-1/pool=p1: 3 of 4") for a in firing)

        assert engine.deliver()["failed"] == 1  # 503: retried later, not now
        assert engine.deliver()["failed"] == 0 and len(rx.requests) == 1
        clock.advance(30)
        assert engine.deliver()["failed"] == 1  # second 503; the next try waits 60 s
        clock.advance(59)
        assert engine.deliver() == {"sent": 0, "failed": 0, "gave_up": 0}
        clock.advance(1)
        assert engine.deliver()["sent"] == 1
        assert len(rx.requests) == 3
        headers, body = rx.requests[-1]
        assert verify("s3cret", body, headers[SIGNATURE_HEADER], clock.now().timestamp())
        assert not verify("other", body, headers[SIGNATURE_HEADER], clock.now().timestamp())
        assert not verify("s3cret", body + b" ", headers[SIGNATURE_HEADER], clock.now().timestamp())
        assert not verify("s3cret", body, headers[SIGNATURE_HEADER], clock.now().timestamp() + 3600)  # replay
        payload = rx.payloads()[-1]
        assert payload["group"] == "provider=aws/region=us-east-1/pool=p1" and len(payload["alerts"]) == 3

        clock.advance(60)
        _cpu(store, clock.now(), {0: 0.3, 1: 0.97, 2: 0.99, 3: 0.2})
        r = engine.evaluate()
        assert r.resolved == 1
        assert engine.deliver()["sent"] == 1
        assert rx.payloads()[-1]["alerts"][0]["state"] == "resolved"
    metrics = app.state.hb.metrics.render().decode()
    assert 'hb_alerts_firing{rule="HostCpuHigh",severity="critical"} 2.0' in metrics


def test_dynamic_baseline_rule_fires_on_a_spend_jump(tmp_path: Path) -> None:
    clock = ManualClock()
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'b.db'}", clock=clock)
    store = app.state.hb.store
    rules = ("groups: [{name: spend, rules: [{alert: SpendAnomaly, baseline: "
             "{metric: spend_usd_per_hour, method: ewma, alpha: 0.1, k: 5, direction: above}}]}]")
    with store.tx() as session:
        put_rules(session, "spend", rules, clock.now())
    rng = np.random.default_rng(1)
    start = clock.now() - timedelta(hours=10)
    with store.tx() as session:
        record(session, [Sample("spend_usd_per_hour", {"namespace": "team-a", "provider": "aws"},
                                40 + rng.normal(0, 1), start + timedelta(minutes=5 * i)) for i in range(120)])
    engine = AlertEngine(store, clock)
    assert engine.evaluate().findings == 0
    with store.tx() as session:
        record(session, [Sample("spend_usd_per_hour", {"namespace": "team-a", "provider": "aws"}, 75.0, clock.now())])
    r = engine.evaluate()
    assert r.fired == 1
    with store.read() as session:
        (alert,) = list_alerts(session, state="firing")
    assert alert["rule"] == "SpendAnomaly" and alert["labels"]["namespace"] == "team-a"


def test_api_refuses_bad_rules_keeps_the_old_and_lists_alerts(tmp_path: Path) -> None:
    clock = ManualClock()
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", clock=clock)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        ok = c.put("/v1/ops/alert-rules/fleet", content=RULES, headers=ADMIN_H)
        assert ok.status_code == 200 and ok.json()["rules"] == 1
        bad = c.put("/v1/ops/alert-rules/fleet", content="groups: [{name: g, rules: [{alert: A, expr: 'cpu >'}]}]",
                    headers=ADMIN_H)
        assert bad.status_code == 422 and "groups[0].rules[0].expr" in bad.json()["detail"]
        (doc,) = c.get("/v1/ops/alert-rules", headers=ADMIN_H).json()["items"]
        assert "HostCpuHigh" in doc["yaml"]
        assert c.put("/v1/ops/alert-rules/fleet", content=RULES).status_code == 401
        assert c.put("/v1/ops/alert-rules/Bad_Name", content=RULES, headers=ADMIN_H).status_code == 422
        bad_sample = c.post("/v1/ops/samples", json={"samples": [{"name": "x", "labels": {"a": "b,c"}, "value": 1}]},
                            headers=ADMIN_H)
        assert bad_sample.status_code == 422
        stored = c.post("/v1/ops/samples", headers=ADMIN_H, json={"samples": [
            {"name": "utilization", "labels": _host(0), "value": 0.99}]})
        assert stored.json() == {"stored": 1}
        clock.advance(301)
        c.post("/v1/ops/samples", headers=ADMIN_H, json={"samples": [
            {"name": "utilization", "labels": _host(0), "value": 0.99}]})
        c.post("/v1/ops/alerts/evaluate", headers=ADMIN_H)  # pending
        clock.advance(300)
        c.post("/v1/ops/samples", headers=ADMIN_H, json={"samples": [
            {"name": "utilization", "labels": _host(0), "value": 0.99}]})
        out = c.post("/v1/ops/alerts/evaluate", headers=ADMIN_H).json()
        assert out["fired"] == 1
        (a,) = c.get("/v1/ops/alerts", params={"state": "firing"}, headers=ADMIN_H).json()["items"]
        assert a["rule"] == "HostCpuHigh" and a["labels"]["host"] == "h0"
        hist = c.get("/v1/ops/metrics/utilization", params={"since": "1h", "match": "host=h0"}, headers=ADMIN_H)
        assert [len(s["points"]) for s in hist.json()["series"]] == [3]
        assert c.get("/v1/ops/metrics/utilization", params={"since": "soon"}, headers=ADMIN_H).status_code == 422


def test_the_collector_exports_fleet_series_and_keeps_them_as_history(tmp_path: Path) -> None:
    from broker.ops.samples import read_series
    from tests.broker.service_support import job_doc

    clock = ManualClock()
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'm.db'}", clock=clock)
    hb = app.state.hb
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        c.post("/v1/namespaces", json={"name": "team"}, headers=ADMIN_H)
        doc = job_doc("etl", cpu="2", providers=["aws"], hours=2,
                      data=[{"uri": "gs://b/set", "location": "gcp:us-central1", "sizeGiB": 3}])
        assert c.post("/v1/namespaces/team/jobs", json=doc, headers=ADMIN_H).status_code == 201
        c.post("/v1/namespaces/team/jobs", json=job_doc("waits", cpu="64", providers=["onprem"]), headers=ADMIN_H)
        clock.advance(30)
        hb.scheduler.run_cycle()  # places and starts etl on aws; the ops hook collects
        text = c.get("/metrics", headers=ADMIN_H).text  # admin only (issue 17)
    assert 'hb_network_bytes_total{dst="aws",src="gcp"} 3.221225472e+09' in text
    assert "hb_provisioning_latency_seconds_count 1.0" in text
    assert 'hb_spend_usd_per_hour{namespace="team",provider="aws"}' in text
    assert 'hb_utilization_ratio{name="localhost",resource="cpu",scope="host"} 0.0' in text
    with hb.store.read() as session:
        (burn,) = read_series(session, "spend_usd_per_hour", selector={"namespace": "team"})
        states = {s.labels["state"]: float(s.values[-1]) for s in read_series(session, "jobs")}
    assert float(burn.values[-1]) > 0 and states.get("RUNNING") == 1.0


def test_an_isolation_forest_rule_fires_on_the_odd_host_and_retrains_on_schedule(tmp_path: Path) -> None:
    clock = ManualClock()
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'f.db'}", clock=clock)
    store = app.state.hb.store
    rules = ("groups: [{name: g, rules: [{alert: HostOdd, anomaly: {metrics: ['utilization{resource=\"cpu\"}', "
             "'utilization{resource=\"memory\"}'], by: host, window: 3d, retrain: 6h, contamination: 0.01}}]}]")
    with store.tx() as session:
        put_rules(session, "g", rules, clock.now())
    rng = np.random.default_rng(0)
    start = clock.now() - timedelta(hours=48)

    def host_samples(host: str, i: int, cpu: float, mem: float) -> list[Sample]:
        base = {"scope": "host", "provider": "onprem", "region": "dc1", "host": host}
        at = start + timedelta(minutes=5 * i)
        return [Sample("utilization", {**base, "resource": "cpu"}, cpu, at),
                Sample("utilization", {**base, "resource": "memory"}, mem, at)]

    with store.tx() as session:
        for i in range(576):
            for host in ("h1", "h2"):
                cpu = 0.5 + 0.2 * np.sin(i / 12) + rng.normal(0, 0.01)
                record(session, host_samples(host, i, cpu, 0.2 + 0.6 * cpu + rng.normal(0, 0.01)))
        # now: h1 normal, h2's memory far off its relation with CPU
        record(session, host_samples("h1", 576, 0.5, 0.5) + host_samples("h2", 576, 0.5, 0.95))
    engine = AlertEngine(store, clock)
    r = engine.evaluate()
    assert r.retrained == 2 and r.fired == 1
    with store.read() as session:
        (alert,) = list_alerts(session, state="firing")
    assert alert["rule"] == "HostOdd" and alert["labels"]["host"] == "h2"
    assert engine.evaluate().retrained == 0  # models are reused until "retrain" has passed
