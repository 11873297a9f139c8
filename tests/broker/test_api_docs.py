"""The API documentation works offline and says true things: /docs and /redoc in a real headless Chromium that
can reach nothing but loopback; the OpenAPI schema has a bearer scheme, a real job-spec example and answer
schemas that real answers of a real server satisfy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from tests.broker.service_support import ADMIN_H, job_doc, make_app, serve_in_thread
from tests.reports.test_reports_browser import driver  # noqa: F401 - the headless Chromium fixture

UNAUTHENTICATED = {"/healthz", "/readyz", "/v1/edge/enroll", "/v1/edge/renew", "/v1/edge/crl",
                   "/v1/edge/probe"}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("docs")
    with serve_in_thread(make_app(tmp, f"sqlite:///{tmp}/broker.db")) as url:
        yield url


@pytest.fixture(scope="module")
def schema(base_url: str) -> dict[str, Any]:
    answer = httpx.get(f"{base_url}/openapi.json")
    assert answer.status_code == 200
    return answer.json()  # type: ignore[no-any-return]


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, item in schema["paths"].items() for m, op in item.items()]


def _validator(schema: dict[str, Any], name: str) -> Any:
    """A validator of component ``name`` that resolves the schema's ``#/components/...`` references."""
    root = {**schema["components"]["schemas"][name], "components": schema["components"]}
    return jsonschema.Draft202012Validator(root)


@pytest.mark.browser
@pytest.mark.slow
def test_swagger_ui_and_redoc_render_every_operation_offline(driver: Any, base_url: str,  # noqa: F811
                                                              schema: dict[str, Any]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    html = httpx.get(f"{base_url}/docs").text
    assert "cdn." not in html and "/docs-assets/swagger-ui-bundle.js" in html

    driver.get(f"{base_url}/docs")
    WebDriverWait(driver, 30).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".opblock")))
    blocks = driver.find_elements(By.CSS_SELECTOR, ".opblock")
    assert len(blocks) == len(_operations(schema))
    paths = {b.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path") for b in blocks}
    assert "/v1/namespaces/{ns}/jobs" in paths and "/v1/placements:preview" in paths
    assert driver.find_element(By.CSS_SELECTOR, "button.authorize").is_displayed()

    driver.get(f"{base_url}/redoc")
    WebDriverWait(driver, 30).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "[data-section-id^='operation/']"))
    )
    sections = driver.find_elements(By.CSS_SELECTOR, "[data-section-id^='operation/']")
    assert len(sections) == len(_operations(schema))
    # ReDoc's sidebar badge "API docs by Redocly" always asks its CDN for a logo and hides the image when that
    # fails; nothing else may fail to load.
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")
              and "cdn.redoc.ly/redoc/logo-mini.svg" not in e["message"]]
    assert errors == []


def test_the_schema_declares_the_bearer_token_and_every_protected_operation_uses_it(
    base_url: str, schema: dict[str, Any]
) -> None:
    (name,) = schema["components"]["securitySchemes"]
    scheme = schema["components"]["securitySchemes"][name]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for method, path, op in _operations(schema):
        assert (op.get("security") == [{name: []}]) is (path not in UNAUTHENTICATED), (method, path)
    # what the schema says is what the server does
    assert httpx.get(f"{base_url}/v1/whoami").status_code == 401
    assert httpx.get(f"{base_url}/metrics").status_code == 401  # admin only: it counts every namespace
    assert httpx.get(f"{base_url}/healthz").status_code == 200


def test_descriptions_are_plain_markdown_without_internals(schema: dict[str, Any]) -> None:
    for method, path, op in _operations(schema):
        text = op.get("description") or ""
        assert "``" not in text and ":class:" not in text and "GroupCommitter" not in text, (method, path, text)


def test_the_job_body_example_is_a_real_spec_the_server_accepts(base_url: str, schema: dict[str, Any]) -> None:
    body = schema["paths"]["/v1/namespaces/{ns}/jobs"]["post"]["requestBody"]["content"]
    example = body["application/json"]["example"]
    assert "additionalProp1" not in str(example)
    answer = httpx.post(f"{base_url}/v1/namespaces/default/jobs", json=example, headers=ADMIN_H)
    assert answer.status_code == 201, answer.text
    _validator(schema, "JobOut").validate(answer.json())
    yaml_answer = httpx.post(f"{base_url}/v1/namespaces/default/jobs", content=body["application/yaml"]["example"],
                             headers={**ADMIN_H, "Content-Type": "application/yaml"})
    assert yaml_answer.status_code == 201, yaml_answer.text


def test_real_answers_match_the_documented_schemas(base_url: str, schema: dict[str, Any]) -> None:
    def check(method: str, path: str, name: str, **kw: Any) -> Any:
        answer = httpx.request(method, f"{base_url}{path}", headers=ADMIN_H, **kw)
        documented = schema["paths"][path.replace("/default/", "/{ns}/") if "/jobs/" not in path else
                                     "/v1/namespaces/{ns}/jobs/{job_id}"][method.lower()]["responses"]
        assert str(answer.status_code) in documented, (path, answer.status_code)
        _validator(schema, name).validate(answer.json())
        return answer.json()

    check("GET", "/v1/whoami", "WhoAmIOut")
    check("GET", "/v1/namespaces", "NamespacesOut")
    check("GET", "/v1/namespaces/default/tokens", "TokensOut")
    burst = check("POST", "/v1/namespaces/default/jobs", "JobsOut", json=[job_doc("a"), job_doc("b")])
    check("GET", "/v1/namespaces/default/jobs", "JobListOut")
    check("GET", f"/v1/namespaces/default/jobs/{burst['jobs'][0]['id']}", "JobDetailOut")
    preview = httpx.post(f"{base_url}/v1/placements:preview", json=job_doc("p"), headers=ADMIN_H)
    _validator(schema, "PreviewOut").validate(preview.json())
    assert preview.json()["explanation"].startswith(preview.json()["placement"]["provider"])
    bad = httpx.post(f"{base_url}/v1/namespaces/default/jobs", json={"kind": "Job"}, headers=ADMIN_H)
    assert bad.status_code == 422
    _validator(schema, "ErrorOut").validate(bad.json())


def test_the_documented_option_is_the_place_json_contract() -> None:
    """The schema's OPTION object and ``PlacementOption.CONTRACT_KEYS`` are one list (a field added to the
    contract, such as ``interruption_usd``, must appear in /docs too)."""
    from broker.api_models import OptionOut
    from broker.model import PlacementOption

    assert list(OptionOut.model_fields) == list(PlacementOption.CONTRACT_KEYS)
