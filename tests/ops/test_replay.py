"""Capacity planning by trace replay through the real scheduler in simulated time: the same recorded
submissions against another quota set or fleet give different waits, deadline misses and spend."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from broker.ops.replay import read_trace, record_trace, replay, synthetic_trace, write_trace

START = datetime(2026, 12, 1, tzinfo=UTC)
FLEET = """\
sites:
  - {name: dc1, continent: eu, uplink_gbps: 10}
hosts:
""" + "".join(f"  - {{name: h{i}, site: dc1, vcpus: 32, memory_gib: 128, owned_usd_per_hour: 0}}\n" for i in range(4))


def test_a_tight_quota_shows_up_as_waits_and_deadline_misses(tmp_path: Path) -> None:
    trace = synthetic_trace(40, start=START, days=0.1, namespaces=("team-a",), seed=2, deadline_fraction=0.5)
    path = tmp_path / "trace.jsonl"
    assert write_trace(path, trace) == 40
    trace = read_trace(path)
    free = replay(trace, tick_seconds=600, providers=("aws", "gcp"))
    quota = {"apiVersion": "hybrid-broker/v1", "kind": "ResourceQuota",
             "metadata": {"name": "small", "namespace": "team-a"}, "spec": {"hard": {"requests.cpu": "8"}}}
    tight = replay(trace, tick_seconds=600, providers=("aws", "gcp"), policies=[quota])
    assert free.succeeded == 40 and free.unfinished == tight.unfinished == 0
    assert free.mean_wait_seconds < 700 and tight.mean_wait_seconds > free.mean_wait_seconds + 1800
    assert tight.deadline_misses > free.deadline_misses  # (a deadline the quota makes unreachable fails the job)
    assert set(free.spend_by_provider) <= {"aws", "gcp"} and free.spend_usd > 0


def test_an_owned_fleet_takes_the_work_and_cuts_spend(tmp_path: Path) -> None:
    inv = tmp_path / "fleet.yaml"
    inv.write_text(FLEET)
    trace = synthetic_trace(30, start=START, days=0.1, seed=4)
    cloud = replay(trace, tick_seconds=600, providers=("aws", "gcp"))
    owned = replay(trace, tick_seconds=600, providers=("onprem", "aws", "gcp"), inventory=inv)
    assert owned.succeeded == cloud.succeeded == 30
    assert owned.jobs_by_provider.get("onprem", 0) > 15
    assert owned.spend_usd < cloud.spend_usd / 2


def test_a_trace_is_recorded_from_a_store(tmp_path: Path) -> None:
    from tests.broker.service_support import make_app

    app = make_app(tmp_path, f"sqlite:///{tmp_path / 'r.db'}")
    hb = app.state.hb
    from broker.lifecycle import submit_jobs
    from broker.spec import parse_job_spec
    from broker.store import NamespaceRow

    docs = [t.doc for t in synthetic_trace(5, start=hb.clock.now(), days=0.01, seed=1, deadline_fraction=0)]
    with hb.store.tx() as session:
        session.add(NamespaceRow(name="ns1", created_at=hb.clock.now()))
        session.flush()
        import json

        submit_jobs(session, "ns1", [parse_job_spec(d) for d in docs], now=hb.clock.now(),
                    spec_docs=[json.dumps(d) for d in docs])
    trace = record_trace(hb.store)
    assert [t.namespace for t in trace] == ["ns1"] * 5
    assert [t.doc["metadata"]["name"] for t in trace] == [d["metadata"]["name"] for d in docs]


def test_broker_replay_records_and_runs_a_trace(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    from broker.lifecycle import submit_jobs
    from broker.spec import parse_job_spec
    from broker.store import NamespaceRow, Store

    url = f"sqlite:///{tmp_path / 'src.db'}"
    from tests.broker.service_support import make_app

    make_app(tmp_path, url)  # a migrated store
    store = Store(url)
    docs = [t.doc for t in synthetic_trace(6, start=START, days=0.01, seed=3, deadline_fraction=0)]
    with store.tx() as session:
        session.add(NamespaceRow(name="ns1", created_at=START))
        session.flush()
        submit_jobs(session, "ns1", [parse_job_spec(d, now=START) for d in docs], now=START,
                    spec_docs=[json.dumps(d) for d in docs])
    store.dispose()
    cli = [sys.executable, "-c", "import sys; from broker.cli import main; main(sys.argv[1:])"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    trace = tmp_path / "t.jsonl"
    r = subprocess.run(cli + ["replay", "record", str(trace), "--database-url", url], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "6 submission(s)" in r.stdout, r.stderr
    r = subprocess.run(cli + ["replay", "run", str(trace), "--providers", "aws", "--tick", "900", "--json"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["jobs"] == out["succeeded"] == 6 and set(out["spend_by_provider"]) == {"aws"}
