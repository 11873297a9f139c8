"""The /v1 API contract against a real uvicorn on loopback, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from tests.broker.service_support import ADMIN_H, job_doc, make_app, serve_in_thread


@pytest.fixture(scope="module")
def client(module_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    app = make_app(tmp_path_factory.mktemp("api"), module_store_url, max_body_bytes=64 * 1024)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        yield c


def _tenant(client: httpx.Client) -> tuple[str, dict[str, str]]:
    """A new namespace and the headers of a token of it."""
    ns = f"team-{secrets.token_hex(3)}"
    assert client.post("/v1/namespaces", json={"name": ns}, headers=ADMIN_H).status_code == 201
    r = client.post(f"/v1/namespaces/{ns}/tokens", headers=ADMIN_H)
    assert r.status_code == 201 and set(r.json()) >= {"token", "id"}
    return ns, {"Authorization": f"Bearer {r.json()['token']}"}


def test_health_and_readiness(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["checks"] == {"store": True, "catalog": True}


def test_one_spec_gives_201_and_the_job(client: httpx.Client) -> None:
    ns, h = _tenant(client)
    r = client.post(f"/v1/namespaces/{ns}/jobs", json=job_doc("train-1", labels={"team": "ml"}), headers=h)
    assert r.status_code == 201
    job = r.json()
    assert {"id", "name", "namespace", "state"} <= set(job)
    assert (job["name"], job["namespace"], job["state"]) == ("train-1", ns, "PENDING")
    got = client.get(f"/v1/namespaces/{ns}/jobs/{job['id']}", headers=h).json()
    assert got["id"] == job["id"] and got["state"] == "PENDING" and got["placement"] is None
    assert got["labels"] == {"team": "ml"} and got["spec"]["metadata"]["name"] == "train-1"
    assert [(e["from"], e["to"]) for e in got["events"]] == [(None, "PENDING")]


def test_a_yaml_body_is_accepted(client: httpx.Client) -> None:
    ns, h = _tenant(client)
    one = client.post(f"/v1/namespaces/{ns}/jobs", content=yaml.safe_dump(job_doc("y-1")),
                      headers=h | {"Content-Type": "application/yaml"})
    assert one.status_code == 201 and one.json()["name"] == "y-1"
    multi = "---\n".join(yaml.safe_dump(job_doc(f"y-{i}")) for i in (2, 3))
    burst = client.post(f"/v1/namespaces/{ns}/jobs", content=multi, headers=h | {"Content-Type": "application/yaml"})
    assert burst.status_code == 201 and [j["name"] for j in burst.json()["jobs"]] == ["y-2", "y-3"]
    listed = client.post(f"/v1/namespaces/{ns}/jobs", content=yaml.safe_dump([job_doc("y-4")]),
                         headers=h | {"Content-Type": "application/yaml"})
    assert listed.status_code == 201 and [j["name"] for j in listed.json()["jobs"]] == ["y-4"]


def test_a_burst_is_accepted_in_order(client: httpx.Client) -> None:
    ns, h = _tenant(client)
    names = [f"b-{i}" for i in range(50)]
    r = client.post(f"/v1/namespaces/{ns}/jobs", json=[job_doc(n) for n in names], headers=h)
    assert r.status_code == 201
    assert [j["name"] for j in r.json()["jobs"]] == names
    assert len({j["id"] for j in r.json()["jobs"]}) == 50


def test_a_burst_with_one_bad_spec_is_refused_whole_with_the_field_path(client: httpx.Client) -> None:
    ns, h = _tenant(client)
    bad = job_doc("b-bad", memory="32GB")
    r = client.post(f"/v1/namespaces/{ns}/jobs", json=[job_doc("b-ok"), bad], headers=h)
    assert r.status_code == 422
    assert r.json()["field"] == "[1].spec.resources.requests.memory"
    assert client.get(f"/v1/namespaces/{ns}/jobs", headers=h).json()["jobs"] == []


BAD_BODIES = [
    (b"{not json", "application/json", ""),
    (b"", "application/json", ""),
    (json.dumps({"kind": "Job"}).encode(), "application/json", "metadata"),
    (json.dumps(job_doc("x", cpu="-1")).encode(), "application/json", "spec.resources.requests.cpu"),
    (json.dumps([]).encode(), "application/json", ""),
    (json.dumps("a string").encode(), "application/json", ""),
    (b"a: [unclosed", "application/yaml", ""),
    (json.dumps(job_doc("x") | {"metadata": {"name": "x", "namespace": "other"}}).encode(), "application/json",
     "metadata.namespace"),
]


@pytest.mark.parametrize(
    "body,ctype,field", BAD_BODIES,
    ids=["malformed JSON", "an empty body", "a spec without metadata", "a negative cpu", "an empty burst",
         "a bare string", "malformed YAML", "a namespace differing from the URL"],
)
def test_invalid_specs_answer_422_with_the_field_path(client: httpx.Client, body: bytes, ctype: str,
                                                       field: str) -> None:
    ns, h = _tenant(client)
    r = client.post(f"/v1/namespaces/{ns}/jobs", content=body, headers=h | {"Content-Type": ctype})
    assert r.status_code == 422, r.text
    assert isinstance(r.json()["detail"], str) and r.json()["detail"]
    if field:
        assert r.json()["field"].startswith(field)


def test_a_body_over_the_limit_answers_413(client: httpx.Client) -> None:
    ns, h = _tenant(client)
    docs = [job_doc(f"big-{i}", labels={"pad": "x" * 60}) for i in range(400)]
    r = client.post(f"/v1/namespaces/{ns}/jobs", json=docs, headers=h)
    assert r.status_code == 413 and "BROKER_MAX_BODY_BYTES" in r.json()["detail"]


def test_idempotency_key_replays_the_first_answer_and_never_duplicates(client: httpx.Client) -> None:
    ns, h = _tenant(client)
    body = [job_doc("i-1"), job_doc("i-2")]
    first = client.post(f"/v1/namespaces/{ns}/jobs", json=body, headers=h | {"Idempotency-Key": "k-1"})
    again = client.post(f"/v1/namespaces/{ns}/jobs", json=body, headers=h | {"Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again.headers.get("Idempotent-Replayed") == "true"
    assert len(client.get(f"/v1/namespaces/{ns}/jobs", headers=h).json()["jobs"]) == 2
    other = client.post(f"/v1/namespaces/{ns}/jobs", json=[job_doc("i-3")], headers=h | {"Idempotency-Key": "k-1"})
    assert other.status_code == 422 and other.json()["field"] == "Idempotency-Key"


AUTH_CASES = [
    ({}, 401),
    ({"Authorization": "Bearer nope"}, 401),
    ({"Authorization": "Basic abc"}, 401),
]


@pytest.mark.parametrize("headers,status", AUTH_CASES,
                         ids=["no token", "an unknown token", "not a bearer token"])
def test_bad_tokens_answer_401(client: httpx.Client, headers: dict[str, str], status: int) -> None:
    ns, _ = _tenant(client)
    assert client.get(f"/v1/namespaces/{ns}/jobs", headers=headers).status_code == status


def test_a_revoked_token_answers_401(client: httpx.Client) -> None:
    ns = f"team-{secrets.token_hex(3)}"
    client.post("/v1/namespaces", json={"name": ns}, headers=ADMIN_H)
    tok = client.post(f"/v1/namespaces/{ns}/tokens", headers=ADMIN_H).json()
    h = {"Authorization": f"Bearer {tok['token']}"}
    assert client.get(f"/v1/namespaces/{ns}/jobs", headers=h).status_code == 200
    assert client.delete(f"/v1/tokens/{tok['id']}", headers=ADMIN_H).status_code == 200
    assert client.get(f"/v1/namespaces/{ns}/jobs", headers=h).status_code == 401
    listed = client.get(f"/v1/namespaces/{ns}/tokens", headers=ADMIN_H).json()["tokens"]
    assert listed[0]["revoked_at"] is not None and "token" not in listed[0]


def test_a_namespace_token_sees_only_its_namespace(client: httpx.Client) -> None:
    ns_a, ha = _tenant(client)
    ns_b, hb = _tenant(client)
    job = client.post(f"/v1/namespaces/{ns_b}/jobs", json=job_doc("secret"), headers=hb).json()
    assert client.get(f"/v1/namespaces/{ns_b}/jobs", headers=ha).status_code == 404
    assert client.get(f"/v1/namespaces/{ns_b}/jobs/{job['id']}", headers=ha).status_code == 404
    assert client.get(f"/v1/namespaces/{ns_a}/jobs/{job['id']}", headers=ha).status_code == 404
    assert client.post(f"/v1/namespaces/{ns_b}/jobs", json=job_doc("x"), headers=ha).status_code == 404
    assert client.get("/v1/namespaces/no-such-ns/jobs", headers=ADMIN_H).status_code == 404
    assert [n["name"] for n in client.get("/v1/namespaces", headers=ha).json()["namespaces"]] == [ns_a]
    assert client.post("/v1/namespaces", json={"name": "mine"}, headers=ha).status_code == 403


def test_namespace_creation_errors(client: httpx.Client) -> None:
    ns, _ = _tenant(client)
    assert client.post("/v1/namespaces", json={"name": ns}, headers=ADMIN_H).status_code == 409
    bad = client.post("/v1/namespaces", json={"name": "Bad_Name"}, headers=ADMIN_H)
    assert bad.status_code == 422 and bad.json()["field"] == "name"
    assert client.post("/v1/namespaces/nope/tokens", headers=ADMIN_H).status_code == 404


def test_listing_filters_by_state_and_label_and_pages_with_a_cursor(client: httpx.Client) -> None:
    ns, h = _tenant(client)
    docs = [job_doc(f"p-{i}", labels={"parity": "even" if i % 2 == 0 else "odd"}) for i in range(7)]
    ids = [j["id"] for j in client.post(f"/v1/namespaces/{ns}/jobs", json=docs, headers=h).json()["jobs"]]
    client.delete(f"/v1/namespaces/{ns}/jobs/{ids[0]}", headers=h)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = client.get(f"/v1/namespaces/{ns}/jobs", params=params, headers=h).json()
        seen += [j["id"] for j in page["jobs"]]
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == ids and pages == 3
    even = client.get(f"/v1/namespaces/{ns}/jobs", params={"label": "parity=even"}, headers=h).json()["jobs"]
    assert [j["id"] for j in even] == ids[0::2]
    pending_even = client.get(f"/v1/namespaces/{ns}/jobs", params={"label": "parity=even", "state": "PENDING"},
                              headers=h).json()["jobs"]
    assert [j["id"] for j in pending_even] == ids[2::2]
    cancelled = client.get(f"/v1/namespaces/{ns}/jobs", params={"state": "CANCELLED"}, headers=h).json()["jobs"]
    assert [j["id"] for j in cancelled] == [ids[0]]
    assert client.get(f"/v1/namespaces/{ns}/jobs", params={"state": "BOGUS"}, headers=h).status_code == 422
    assert client.get(f"/v1/namespaces/{ns}/jobs", params={"label": "novalue"}, headers=h).status_code == 422
    assert client.get(f"/v1/namespaces/{ns}/jobs", params={"limit": 0}, headers=h).status_code == 422


def test_cancel_a_pending_job_then_cancelling_again_conflicts(client: httpx.Client) -> None:
    ns, h = _tenant(client)
    job = client.post(f"/v1/namespaces/{ns}/jobs", json=job_doc("c-1"), headers=h).json()
    r = client.delete(f"/v1/namespaces/{ns}/jobs/{job['id']}", headers=h)
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    assert [(e["from"], e["to"]) for e in r.json()["events"]] == [(None, "PENDING"), ("PENDING", "CANCELLED")]
    assert client.delete(f"/v1/namespaces/{ns}/jobs/{job['id']}", headers=h).status_code == 409
    assert client.delete(f"/v1/namespaces/{ns}/jobs/j-nope", headers=h).status_code == 404


def test_logs_of_a_job_without_an_on_prem_run_conflict(client: httpx.Client) -> None:
    ns, h = _tenant(client)
    job = client.post(f"/v1/namespaces/{ns}/jobs", json=job_doc("l-1"), headers=h).json()
    r = client.get(f"/v1/namespaces/{ns}/jobs/{job['id']}/logs", headers=h)
    assert r.status_code == 409 and "on-prem" in r.json()["detail"]


def test_preview_answers_the_place_json_and_submits_nothing(client: httpx.Client) -> None:
    from broker.model import PlacementOption

    ns, h = _tenant(client)
    r = client.post("/v1/placements:preview", json=job_doc("pv", cpu="16", memory="64Gi", providers=["aws"]),
                    headers=h)
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"job", "placement", "alternatives", "considered", "feasible", "rejected", "explanation"}
    assert tuple(body["placement"]) == PlacementOption.CONTRACT_KEYS
    assert body["placement"]["provider"] == "aws" and body["placement"]["vcpus"] >= 16
    assert body["alternatives"] and all(a["total_usd"] >= body["placement"]["total_usd"] for a in body["alternatives"])
    assert client.get(f"/v1/namespaces/{ns}/jobs", headers=h).json()["jobs"] == []
    bad = client.post("/v1/placements:preview", json=job_doc("pv", accelerator="Z9000"), headers=h)
    assert bad.status_code == 422


def test_catalog_offers_are_filtered_and_cheapest_first(client: httpx.Client) -> None:
    _, h = _tenant(client)
    r = client.get("/v1/catalog/offers", params={"provider": "aws", "min_vcpus": 8, "limit": 20}, headers=h)
    assert r.status_code == 200
    offers = r.json()["offers"]
    assert len(offers) == 20 and r.json()["total"] >= 20
    assert all(o["provider"] == "aws" and o["vcpus"] >= 8 for o in offers)
    prices = [o["hourly_usd"] for o in offers]
    assert prices == sorted(prices)


def test_metrics_expose_jobs_by_state(client: httpx.Client) -> None:
    ns, h = _tenant(client)
    client.post(f"/v1/namespaces/{ns}/jobs", json=[job_doc("m-1"), job_doc("m-2")], headers=h)
    assert client.get("/metrics").status_code == 401, "namespaces and their counts are for admins only"
    assert client.get("/metrics", headers=h).status_code == 403
    text = client.get("/metrics", headers=ADMIN_H).text
    assert f'hb_jobs{{namespace="{ns}",state="PENDING"}} 2.0' in text
    assert "hb_placement_latency_seconds_bucket" in text and "hb_queue_wait_seconds_bucket" in text


def test_openapi_documents_the_contract_paths(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/v1/namespaces", "/v1/namespaces/{ns}/tokens", "/v1/namespaces/{ns}/jobs",
              "/v1/namespaces/{ns}/jobs/{job_id}", "/v1/namespaces/{ns}/jobs/{job_id}/logs",
              "/v1/placements:preview", "/v1/catalog/offers", "/healthz", "/readyz", "/metrics"):
        assert p in paths
    assert client.get("/docs").status_code == 200


PUBLIC = {"/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/v1/edge/enroll",
          "/v1/edge/renew", "/v1/edge/crl", "/v1/edge/probe"}


def _concrete(path: str, ns: str, job_id: str, token_id: str) -> str:
    """``path`` with its parameters filled with the victim's ids (or ``ns``), per route family."""
    kind, name = {"/v1/policies/": ("Budget", "money"), "/v1/ops/heartbeats/": ("host", "secret-host"),
                  "/v1/ops/pools/": ("", "warm"), "/v1/ops/alert-rules/": ("", "fleet"),
                  "/v1/ops/metrics/": ("", "jobs")}.get(next((p for p in ("/v1/policies/", "/v1/ops/heartbeats/",
                  "/v1/ops/pools/", "/v1/ops/alert-rules/", "/v1/ops/metrics/") if path.startswith(p)), ""), ("", ""))
    return path.format(ns=ns, job_id=job_id, token_id=token_id, device_id="dev-secret", kind=kind, name=name)


def test_every_route_answers_every_kind_of_caller_without_leaking_another_namespace(
    tmp_path_factory: pytest.TempPathFactory, store_url: str
) -> None:
    """Issue 17: a sweep of every served route (the route table of docs/API.md, so a new route is swept too)
    with no token, a malformed, unknown or revoked token, and a namespace token aimed at another namespace's
    ids or at its own: never a 5xx; every authenticated route refuses the first four (401) and the namespace
    token where it is not its namespace (403 admin-only, 404 another namespace); and no answer names the other
    namespace, its job, labels or token, or the server's data directory."""
    from tests.broker.test_service_routes_doc import route_rows

    tmp = tmp_path_factory.mktemp("sweep")
    app = make_app(tmp, store_url)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        secret, _ = _tenant(c)
        mine, mine_h = _tenant(c)
        secret_token = c.post(f"/v1/namespaces/{secret}/tokens", headers=ADMIN_H).json()["id"]
        revoked = c.post(f"/v1/namespaces/{mine}/tokens", headers=ADMIN_H).json()
        assert c.delete(f"/v1/tokens/{revoked['id']}", headers=ADMIN_H).status_code == 200
        job = c.post(f"/v1/namespaces/{secret}/jobs", headers=ADMIN_H,
                     json=job_doc("secret-job-name", labels={"project": "secret-label"})).json()["id"]
        applied = c.post("/v1/policies:apply", headers=ADMIN_H, json={"items": [
            {"apiVersion": "hybrid-broker/v1", "kind": "Budget", "metadata": {"name": "money", "namespace": secret},
             "spec": {"dailyUSD": 10, "enforcement": "hard"}},
            {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": secret},
             "spec": {"hard": {"requests.cpu": "4"}}},
            {"apiVersion": "hybrid-broker/v1", "kind": "AllowedPriorityClasses", "metadata": {"namespace": secret},
             "spec": {"priorityClassNames": ["secret-class"]}}]})
        assert applied.status_code == 200, applied.text
        assert c.post("/v1/ops/samples", headers=ADMIN_H, json={"samples": [
            {"name": "jobs", "labels": {"namespace": secret, "state": "PENDING"}, "value": 1}]}).status_code == 200
        assert c.put("/v1/ops/pools/warm", headers=ADMIN_H, content=POOL.replace("NS", secret)).status_code == 200
        assert c.post("/v1/ops/heartbeats/host/secret-host", headers=ADMIN_H).status_code == 200
        assert c.post("/v1/edge/ca", headers=ADMIN_H, json={}).status_code == 201
        markers = [secret, job, "secret-job-name", "secret-label", "secret-class", "secret-host", secret_token,
                   str(tmp)]
        callers = {
            "no token": ({}, secret), "not a bearer token": ({"Authorization": "Basic abc"}, secret),
            "an unknown token": ({"Authorization": "Bearer hb_nope"}, secret),
            "a revoked token": ({"Authorization": f"Bearer {revoked['token']}"}, secret),
            "a token of another namespace": (mine_h, secret),
            "a namespace token with another namespace's ids": (mine_h, mine),
        }
        swept = 0
        for method, path, _tag, auth, _what in route_rows(app):
            for caller, (headers, ns) in callers.items():
                target = _concrete(path, ns, job, secret_token)
                r = c.request(method, target, headers=headers, json={} if method in ("POST", "PUT") else None,
                              params={"bytes": 16})
                where = f"{method} {path} with {caller}: {r.status_code} {r.text[:300]}"
                swept += 1
                assert r.status_code < 500, where
                leaked = [m for m in markers if m in r.text and m not in target]  # echoing its own words is fine
                assert not leaked, f"{where} names {leaked}"
                if path in PUBLIC:
                    assert auth == "no bearer token", path
                elif not caller.startswith("a") or caller in ("an unknown token", "a revoked token"):
                    assert r.status_code == 401, where
                elif auth == "admin":
                    assert r.status_code in ((403, 404) if "{ns}" in path else (403,)), where
                elif "{ns}" in path and ns == secret:
                    assert r.status_code == 404, where
                elif "{job_id}" in path:
                    assert r.status_code == 404, where
            assert path in PUBLIC or auth != "no bearer token", f"{path} is served without a bearer token"
        # the admin reads every route without a server error (what it may see includes the other namespace)
        for method, path, *_ in route_rows(app):
            if method == "GET":
                r = c.get(_concrete(path, secret, job, secret_token), headers=ADMIN_H, params={"bytes": 16})
                assert r.status_code < 500, (path, r.status_code, r.text[:300])
    assert swept >= 6 * 55


POOL = """
kind: Pool
spec:
  namespace: NS
  provider: aws
  region: us-east-1
  instanceType: {name: m7i.2xlarge, vcpus: 8, memoryGiB: 32, hourlyUSD: 0.4032}
  minReplicas: 1
  maxReplicas: 6
"""
