"""``broker alerts``, ``broker history`` and ``broker recommendations`` against a real server; bad input is
one line on stderr and exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from broker.clock import ManualClock
from broker.ops.alerts import AlertEngine, put_rules
from broker.ops.samples import Sample, record
from tests.broker.service_support import ADMIN, make_app, serve_in_thread

CLI = [sys.executable, "-c", "import sys; from broker.cli import main; main(sys.argv[1:])"]


def _run(args: list[str], url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")} | {
        "BROKER_URL": url, "BROKER_TOKEN": ADMIN}
    return subprocess.run(CLI + args, env=env, capture_output=True, text=True, timeout=120)


def test_alerts_history_and_recommendations_commands(tmp_path: Path) -> None:
    clock = ManualClock()
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'cli.db'}", clock=clock)
    store = app.state.hb.store
    labels = {"scope": "host", "provider": "onprem", "region": "local", "host": "h1", "resource": "cpu"}
    with store.tx() as session:
        record(session, [Sample("utilization", labels, 0.2 + 0.01 * i, clock.now() - timedelta(minutes=60 - i))
                         for i in range(60)])
        record(session, [Sample("job_memory_used_gib", {"namespace": "default", "job": "nightly"}, v,
                                clock.now() - timedelta(days=d)) for d, v in ((1, 8.2), (2, 9.1), (3, 7.5))])
        put_rules(session, "fleet", "groups: [{name: g, rules: [{alert: HostBusy, "
                  "expr: 'utilization{resource=\"cpu\"} > 0.5'}]}]", clock.now())
    from tests.broker.service_support import job_doc

    with serve_in_thread(app) as url:
        import httpx

        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
            c.post("/v1/namespaces/default/jobs", json=job_doc("nightly", memory="32Gi"))
        r = _run(["alerts", "list"], url)
        assert (r.returncode, r.stdout) == (0, "no alerts\n")  # one line, not an empty table
        AlertEngine(store, clock).evaluate()

        r = _run(["alerts", "list", "--json"], url)
        assert r.returncode == 0, r.stderr
        (alert,) = json.loads(r.stdout)
        assert alert["rule"] == "HostBusy" and alert["state"] == "firing" and alert["labels"]["host"] == "h1"
        r = _run(["alerts", "list"], url)
        assert r.returncode == 0 and "HostBusy" in r.stdout and "host=h1" in r.stdout

        bad = tmp_path / "bad.yaml"
        bad.write_text("groups: [{name: g, rules: [{alert: A, expr: 'cpu >'}]}]")
        r = _run(["alerts", "apply", str(bad)], url)
        assert r.returncode == 2 and "groups[0].rules[0].expr" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        good = Path(__file__).resolve().parents[2] / "examples" / "alerts" / "fleet.yaml"
        r = _run(["alerts", "apply", str(good)], url)
        assert r.returncode == 0 and "stored 5 rule(s) as fleet" in r.stdout

        png = tmp_path / "cpu.png"
        r = _run(["history", "utilization", "--since", "2h", "--match", "host=h1", "--plot", str(png), "--json"], url)
        assert r.returncode == 0, r.stderr
        (row,) = json.loads(r.stdout)
        assert row["points"] == 60 and abs(row["slope_per_hour"] - 0.6) < 0.01  # +0.01 a minute
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        r = _run(["history", "utilization", "--match", "nohost"], url)
        assert r.returncode == 2 and "label=value" in r.stderr

        r = _run(["recommendations"], url)
        assert r.returncode == 0 and "nightly: asks 32.0 GiB, used at most 9.1 GiB" in r.stdout


def test_a_vpa_recommendation_lowers_a_later_runs_request_only() -> None:
    from broker.ops.vpa import Recommendation, apply_to_spec
    from tests.broker.service_support import job_doc

    recs = [Recommendation("memory", "default", "nightly", 32.0, 9.1, 10.5, 3, ""),
            Recommendation("cpu", "default", "other", 8.0, 1.0, 1.2, 3, "")]
    doc = job_doc("nightly", cpu="8", memory="32Gi")
    out = apply_to_spec(doc, recs)
    assert out["spec"]["resources"]["requests"] == {"cpu": "8", "memory": "10.5Gi"}
    assert doc["spec"]["resources"]["requests"]["memory"] == "32Gi"  # the original is not changed


def test_vertical_scaling_initial_lowers_a_recurring_jobs_requests_at_submission(tmp_path: Path) -> None:
    """``spec.verticalScaling.updateMode: Initial``: the requests of a recurring job's new run are lowered to
    what its earlier runs used (peak + 15 %, never below ``minAllowed``, never raised); ``Off`` (the default)
    and a job with too few measured runs keep what they ask. Measured usage is pushed through the API."""
    import httpx

    from tests.broker.service_support import job_doc

    clock = ManualClock()
    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'vpa.db'}", clock=clock)
    days = ((1, 8.2, 0.6), (2, 9.1, 0.9), (3, 7.5, 0.7))
    pushed = [{"name": "job_memory_used_gib", "labels": {"namespace": "default", "job": "nightly"}, "value": m,
               "at": (clock.now() - timedelta(days=d)).isoformat()} for d, m, _ in days]
    pushed += [{"name": "job_cpu_used", "labels": {"namespace": "default", "job": "nightly"}, "value": c,
                "at": (clock.now() - timedelta(days=d)).isoformat()} for d, _, c in days]
    pushed += [{"name": "job_memory_used_gib", "labels": {"namespace": "default", "job": "twice"}, "value": 1.0,
                "at": (clock.now() - timedelta(days=d)).isoformat()} for d in (1, 2)]
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        assert c.post("/v1/ops/samples", json={"samples": pushed}).status_code == 200

        def submit(doc: dict[str, Any]) -> dict[str, Any]:
            r = c.post("/v1/namespaces/default/jobs", json=doc)
            assert r.status_code == 201, r.text
            return dict(c.get(f"/v1/namespaces/default/jobs/{r.json()['id']}").json())

        auto = submit(job_doc("nightly", cpu="4", memory="32Gi", verticalScaling={"updateMode": "Initial"}))
        # memory: 9.1 GiB * 1.15 = 10.465 -> 10.5 GiB; cpu: 0.9 * 1.15 = 1.035 -> 1.1 vCPU
        assert auto["spec"]["spec"]["resources"]["requests"] == {"cpu": "1.1", "memory": "10.5Gi"}
        assert auto["spec"]["metadata"]["annotations"]["vpa.hybrid-broker.io/original-requests"] == \
            "cpu=4,memory=32Gi"
        (lowered,) = [e for e in auto["events"] if "verticalScaling" in e["reason"]]
        assert "memory 32.0 GiB -> 10.5 GiB (used at most 9.1 GiB over 3 runs)" in lowered["reason"]
        assert "cpu 4 -> 1.1 vCPU" in lowered["reason"]
        floor = submit(job_doc("nightly", cpu="4", memory="32Gi",
                               verticalScaling={"updateMode": "Initial", "minAllowed": {"memory": "16Gi"}}))
        assert floor["spec"]["spec"]["resources"]["requests"] == {"cpu": "1.1", "memory": "16Gi"}
        small = submit(job_doc("nightly", cpu="1", memory="4Gi", verticalScaling={"updateMode": "Initial"}))
        assert small["spec"]["spec"]["resources"]["requests"] == {"cpu": "1", "memory": "4Gi"}  # never raised
        off = submit(job_doc("nightly", cpu="4", memory="32Gi"))
        assert off["spec"]["spec"]["resources"]["requests"] == {"cpu": "4", "memory": "32Gi"}
        few = submit(job_doc("twice", memory="8Gi", verticalScaling={"updateMode": "Initial"}))
        assert few["spec"]["spec"]["resources"]["requests"]["memory"] == "8Gi"  # 2 runs: under min_runs
        assert not any("verticalScaling" in e["reason"] for j in (small, off, few) for e in j["events"])
        bad = c.post("/v1/namespaces/default/jobs", json=job_doc("nightly", verticalScaling={"updateMode": "Auto"}))
        assert bad.status_code == 422 and "verticalScaling.updateMode" in bad.text and "Initial" in bad.text
