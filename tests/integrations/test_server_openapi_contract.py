"""The server keeps the contract it publishes: Schemathesis generates requests from
``/openapi.json`` (valid and invalid, a fixed seed, a bounded number a route) against a live
server, and every answer must be a documented status with a documented content type and a
body matching its schema, never a 5xx from bad input."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from integration_helpers import SERVED_NAME, assert_server_clean
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.integrations.server import BackgroundServer, build_app

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
EXAMPLES_PER_ROUTE = 60


@pytest.fixture(scope="module")
def contract_server(engine: AsyncLLM) -> Iterator[BackgroundServer]:
    with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as running:
        yield running


OPERATIONS = [
    ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/health"),
    ("GET", "/v1/models"), ("GET", "/v1/models/{model_id}"), ("POST", "/tokenize"),
    ("POST", "/detokenize"), ("GET", "/metrics"), ("GET", "/kv_events"),
    ("POST", "/v1/cache/warm"), ("POST", "/v1/cache/pin"), ("POST", "/v1/cache/unpin"),
    ("POST", "/v1/cache/lookup"), ("GET", "/v1/cache/stats"), ("POST", "/v1/cache/reset"),
]


def _served_model(case):
    """A valid case names the served model (any other name is a 404, which the schema's
    free-form ``model`` string cannot say), so most of them reach the engine."""
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = SERVED_NAME
    return case


@pytest.fixture(scope="module")
def api_schema(contract_server: BackgroundServer):
    return schemathesis.openapi.from_url(f"{contract_server.base_url}/openapi.json")


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_every_answer_keeps_the_published_contract(api_schema, contract_server, method: str,
                                                   path: str) -> None:
    operation = api_schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE).map(_served_model),
                      operation.as_strategy(GenerationMode.NEGATIVE))

    @settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), database=None)
    @given(case=cases)
    def keeps_the_contract(case) -> None:
        case.call_and_validate(base_url=contract_server.base_url, checks=CHECKS)

    keeps_the_contract()


def test_the_contract_documents_what_the_server_answers(contract_server) -> None:
    published = httpx.get(f"{contract_server.base_url}/openapi.json").json()
    paths = published["paths"]
    assert sorted((m.upper(), p) for p, ops in paths.items() for m in ops) == sorted(OPERATIONS)
    for path, operations in paths.items():
        for operation in operations.values():
            assert "422" not in operation["responses"], path  # bad input is a 400 here
    completions = paths["/v1/completions"]["post"]["responses"]
    assert set(completions["200"]["content"]) == {"application/json", "text/event-stream"}
    assert {"400", "404", "413", "429", "500", "503"} <= set(completions)
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    error = completions["400"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/ErrorResponse"}
    assert_server_clean(contract_server.base_url)
