"""Policy documents through the real API (uvicorn on loopback, SQLite and PostgreSQL), the `broker apply`
CLI, and the admission hook in the real scheduler: held jobs show readable reasons."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.broker.service_support import ADMIN_H, job_doc, make_app, serve_in_thread


@pytest.fixture(scope="module")
def served(module_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, httpx.Client]]:
    from broker.policy_store import PolicyAdmission

    app = make_app(tmp_path_factory.mktemp("policies-api"), module_store_url)
    hb = app.state.hb
    hb.scheduler.admission_checks.append(PolicyAdmission(hb.store))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        yield app, c


def tenant(client: httpx.Client) -> tuple[str, dict[str, str]]:
    ns = f"team-{secrets.token_hex(3)}"
    assert client.post("/v1/namespaces", json={"name": ns}, headers=ADMIN_H).status_code == 201
    r = client.post(f"/v1/namespaces/{ns}/tokens", headers=ADMIN_H)
    return ns, {"Authorization": f"Bearer {r.json()['token']}"}


def quota(ns: str, hard: dict[str, Any], name: str = "compute") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": ns},
            "spec": {"hard": hard}}


def test_apply_list_and_update_documents(served: tuple[Any, httpx.Client]) -> None:
    _, client = served
    ns, h = tenant(client)
    budget = {"apiVersion": "hybrid-broker/v1", "kind": "Budget", "metadata": {"name": "money", "namespace": ns},
              "spec": {"dailyUSD": 50, "monthlyUSD": 900, "enforcement": "hard"}}
    pclass = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
              "metadata": {"name": f"pc-{ns}"}, "value": 500}
    r = client.post("/v1/policies:apply", json={"items": [quota(ns, {"requests.cpu": "8"}), budget, pclass]},
                    headers=ADMIN_H)
    assert r.status_code == 200, r.text
    assert [a["action"] for a in r.json()["applied"]] == ["created", "created", "created"]
    again = client.post("/v1/policies:apply", content=yaml.safe_dump_all([quota(ns, {"requests.cpu": "16"}), budget]),
                        headers=ADMIN_H | {"Content-Type": "application/yaml"})
    assert [a["action"] for a in again.json()["applied"]] == ["configured", "unchanged"]

    quotas = client.get(f"/v1/namespaces/{ns}/quotas", headers=h).json()["items"]
    assert quotas == [{"namespace": ns, "name": "compute", "cohort": None, "borrowingLimit": {},
                       "status": {"requests.cpu": {"used": 0.0, "hard": 16.0}}}]
    got = client.get(f"/v1/namespaces/{ns}/budget", headers=h).json()
    assert got["budgets"][0]["dailyUSD"] == 50 and got["burn"]["today_usd"] == 0
    assert set(got["burn"]) >= {"month_usd", "projected_month_usd", "daily_rate_usd"}
    classes = client.get("/v1/priorityclasses", headers=h).json()["items"]
    assert {"name": f"pc-{ns}", "value": 500, "preemptionPolicy": "PreemptLowerPriority", "globalDefault": False,
            "description": ""} in classes
    assert client.delete(f"/v1/policies/ResourceQuota/compute?namespace={ns}", headers=ADMIN_H).status_code == 200
    assert client.get(f"/v1/namespaces/{ns}/quotas", headers=h).json()["items"] == []
    assert client.delete(f"/v1/policies/ResourceQuota/compute?namespace={ns}", headers=ADMIN_H).status_code == 404


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"items": [{"kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "x"},
                     "spec": {"hard": {"requests.cpu": "many"}}}]}, 422, "items[0].spec.hard.requests.cpu"),
        ({"kind": "Pod"}, 422, "items[0].kind"),
        ([1, 2], 422, "items[0]"),
    ],
    ids=["a bad quantity names the document and field", "an unknown kind is refused",
         "a list of non-documents is refused"],
)
def test_bad_documents_are_422_with_the_field(served: tuple[Any, httpx.Client], body: Any, status: int,
                                              field: str) -> None:
    r = served[1].post("/v1/policies:apply", json=body, headers=ADMIN_H)
    assert r.status_code == status and r.json()["field"] == field, r.text


def test_auth_and_conflicts(served: tuple[Any, httpx.Client]) -> None:
    _, client = served
    ns, h = tenant(client)
    assert client.post("/v1/policies:apply", json=quota(ns, {"cpu": 1}), headers=h).status_code == 403
    assert client.post("/v1/policies:apply", json=quota(ns, {"cpu": 1})).status_code == 401
    other, _ = tenant(client)
    assert client.get(f"/v1/namespaces/{other}/budget", headers=h).status_code == 404
    d1 = {"kind": "PriorityClass", "metadata": {"name": f"d1-{ns}"}, "value": 1, "globalDefault": True}
    d2 = {"kind": "PriorityClass", "metadata": {"name": f"d2-{ns}"}, "value": 2, "globalDefault": True}
    assert client.post("/v1/policies:apply", json=d1, headers=ADMIN_H).status_code == 200
    r = client.post("/v1/policies:apply", json=d2, headers=ADMIN_H)
    assert r.status_code == 409 and "globalDefault" in r.json()["detail"]
    d1["globalDefault"] = False
    assert client.post("/v1/policies:apply", json=d1, headers=ADMIN_H).status_code == 200


def test_quota_holds_a_job_with_a_readable_reason_in_get_job(served: tuple[Any, httpx.Client]) -> None:
    app, client = served
    ns, h = tenant(client)
    client.post("/v1/policies:apply", json=quota(ns, {"requests.cpu": "1", "count/jobs": "5"}), headers=ADMIN_H)
    first = client.post(f"/v1/namespaces/{ns}/jobs", headers=h,
                        json=job_doc("a", command=["sleep", "5"], providers=["onprem"])).json()
    second = client.post(f"/v1/namespaces/{ns}/jobs", headers=h,
                         json=job_doc("b", command=["true"], providers=["onprem"])).json()
    scheduler = app.state.hb.scheduler
    scheduler.run_cycle()
    a = client.get(f"/v1/namespaces/{ns}/jobs/{first['id']}", headers=h).json()
    b = client.get(f"/v1/namespaces/{ns}/jobs/{second['id']}", headers=h).json()
    assert a["state"] != "PENDING" and a["held_reason"] is None
    assert b["state"] == "PENDING"
    assert b["held_reason"].startswith("QuotaExceeded: requests.cpu 1/1, job needs 1 (quota " + ns), b
    assert any(e["reason"] and e["reason"].startswith("held: QuotaExceeded") for e in b["events"])
    used = client.get(f"/v1/namespaces/{ns}/quotas", headers=h).json()["items"][0]["status"]
    assert used["requests.cpu"] == {"used": 1.0, "hard": 1.0} and used["count/jobs"]["used"] == 1.0
    client.post(f"/v1/namespaces/{ns}/jobs/{first['id']}:cancel", headers=h)


def test_cli_apply(served: tuple[Any, httpx.Client], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str]) -> None:
    from broker.cli import main

    _, client = served
    ns, h = tenant(client)
    monkeypatch.setenv("BROKER_URL", str(client.base_url))
    monkeypatch.setenv("BROKER_TOKEN", ADMIN_H["Authorization"].split()[1])
    good = tmp_path / "policies.yaml"
    good.write_text(yaml.safe_dump_all([quota(ns, {"requests.cpu": "4", "requests.memory": "16Gi"}),
                                        {"kind": "Budget", "metadata": {"namespace": ns}, "spec": {"dailyUSD": 5}}]))
    with pytest.raises(SystemExit) as done:
        main(["apply", "-f", str(good)])
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    assert f"resourcequota/compute ({ns}) created" in out and f"budget/{ns} ({ns}) created" in out
    with pytest.raises(SystemExit) as done:
        main(["policies", "quotas", ns])
    assert "requests.memory" in capsys.readouterr().out

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(quota(ns, {"requests.cpu": "lots"})))
    with pytest.raises(SystemExit) as done:
        main(["apply", "-f", str(bad)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and "spec.hard.requests.cpu" in err
    assert "Traceback" not in err
    with pytest.raises(SystemExit) as done:
        main(["apply", "-f", str(tmp_path / "missing.yaml")])
    assert done.value.code == 2 and "no such file" in capsys.readouterr().err


def test_cli_sets_and_shows_the_classes_a_namespace_may_use(
    served: tuple[Any, httpx.Client], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from broker.cli import main

    _, client = served
    ns, h = tenant(client)
    cls = f"gold-{ns}"
    monkeypatch.setenv("BROKER_URL", str(client.base_url))
    monkeypatch.setenv("BROKER_TOKEN", ADMIN_H["Authorization"].split()[1])
    doc = tmp_path / "allowed.yaml"
    doc.write_text(yaml.safe_dump_all([
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": cls}, "value": 500},
        {"apiVersion": "hybrid-broker/v1", "kind": "AllowedPriorityClasses", "metadata": {"namespace": ns},
         "spec": {"priorityClassNames": [cls]}}]))

    def run(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as done:
            main(list(args))
        out = capsys.readouterr()
        return int(done.value.code or 0), out.out, out.err

    code, out, _ = run("apply", "-f", str(doc))
    assert code == 0 and f"allowedpriorityclasses/{ns} ({ns}) created" in out, out
    code, out, _ = run("policies", "allow", ns)
    assert code == 0 and out.splitlines()[0] == f"{ns}: allow-list: {cls}" and cls in out.splitlines()[1]
    assert client.post(f"/v1/namespaces/{ns}/jobs", headers=h, json=job_doc("g", priorityClassName=cls)).status_code \
        == 201
    code, out, _ = run("policies", "allow", ns, "--none")
    assert code == 0 and out.splitlines()[0] == f"{ns}: allow-list: none"
    assert client.post(f"/v1/namespaces/{ns}/jobs", headers=h, json=job_doc("g", priorityClassName=cls)).status_code \
        == 403
    code, out, _ = run("policies", "allow", ns, "--reset")
    assert code == 0 and "no allow-list: classes at or below the default priority (0)" in out
    code, _, err = run("policies", "allow", ns, cls, "--reset")
    assert code == 2 and err.count("\n") == 1 and "not several" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"kind": "AllowedPriorityClasses", "metadata": {"namespace": ns},
                                   "spec": {"priorityClassNames": "gold"}}))
    code, _, err = run("apply", "-f", str(bad))
    assert code == 2 and "spec.priorityClassNames" in err and "Traceback" not in err


def test_admission_hook_cuts_a_burst_at_the_budget_and_alerts_on_soft_budgets(
        served: tuple[Any, httpx.Client]) -> None:
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from broker.policy_store import PolicyAdmission
    from broker.spec import parse_job_spec

    app, client = served
    hard_ns, _ = tenant(client)
    soft_ns, _ = tenant(client)
    docs = [{"kind": "Budget", "metadata": {"namespace": hard_ns}, "spec": {"dailyUSD": 10}},
            {"kind": "Budget", "metadata": {"namespace": soft_ns}, "spec": {"dailyUSD": 10, "enforcement": "soft"}}]
    assert client.post("/v1/policies:apply", json=docs, headers=ADMIN_H).status_code == 200
    alerts: list[tuple[str, str]] = []
    hook = PolicyAdmission(app.state.hb.store, estimate=lambda job: 4.0, on_alert=lambda j, t: alerts.append((j, t)))
    now = datetime.now(UTC)
    snapshot = SimpleNamespace(now=now, onprem_free={})

    def job(ns: str, i: int) -> Any:
        return SimpleNamespace(id=f"{ns}-{i}", namespace=ns, priority=0, created_at=now,
                               spec=parse_job_spec(job_doc(f"j{i}")))

    hard = [hook(job(hard_ns, i), snapshot) for i in range(4)]
    assert hard[:2] == [None, None]
    assert hard[2] is not None
    assert hard[2].startswith(f"BudgetExceeded: daily budget of {hard_ns} spent $8.00 of $10.00")
    soft = [hook(job(soft_ns, i), snapshot) for i in range(4)]
    assert soft == [None] * 4
    assert [j for j, _ in alerts] == [f"{soft_ns}-2", f"{soft_ns}-3"]
    assert all(t.startswith("BudgetAlert: ") for _, t in alerts)
    fresh = hook(job(hard_ns, 9), SimpleNamespace(now=now, onprem_free={}))
    assert fresh is None, "a new scheduler snapshot reloads spend from the store (nothing was placed)"
