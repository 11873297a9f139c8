"""Property-based API fuzzing with schemathesis against the app's own OpenAPI schema: no input gives a 500.

A bounded number of examples per operation keeps it fast; it runs on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.broker.service_support import ADMIN_H, make_app, serve_in_thread


@pytest.fixture(scope="module")
def api_schema(module_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    app = make_app(tmp_path_factory.mktemp("fuzz"), module_store_url, max_body_bytes=16 * 1024)
    with serve_in_thread(app) as url:
        yield schemathesis.openapi.from_url(f"{url}/openapi.json")


@pytest.mark.slow
def test_no_input_gives_a_server_error(api_schema: Any) -> None:
    failures: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 12

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case: Any) -> None:
            response = case.call(headers=ADMIN_H, timeout=30)
            # 503 is a deliberate 'not configured here' answer (e.g. edge enrolment without a CA).
            if response.status_code >= 500 and response.status_code != 503:
                failures.append(f"{case.method} {case.formatted_path} -> {response.status_code}: "
                                f"{response.text[:200]}")

        run()
    assert not failures, "\n".join(failures[:10])
