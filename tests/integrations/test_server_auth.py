"""With an API key every route but /health needs it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from integration_helpers import SERVED_NAME, assert_openai_error

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.integrations.server import BackgroundServer, build_app

KEY = "sk-test-key"


@pytest.fixture(scope="module")
def keyed_server(engine: AsyncLLM) -> Iterator[BackgroundServer]:
    with BackgroundServer(build_app(engine, model_name=SERVED_NAME, api_key=KEY)) as server:
        yield server


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
    ("GET", "/metrics"), ("POST", "/tokenize"), ("GET", "/v1/cache/stats"),
    ("POST", "/v1/cache/reset"), ("POST", "/v1/cache/warm"),
])
def test_routes_need_the_key(keyed_server: BackgroundServer, method: str, path: str) -> None:
    url = f"{keyed_server.base_url}{path}"
    assert_openai_error(httpx.request(method, url, json={}), 401, code="invalid_api_key")
    wrong = httpx.request(method, url, json={}, headers={"Authorization": "Bearer nope"})
    assert_openai_error(wrong, 401)


def test_health_is_open_and_key_works(keyed_server: BackgroundServer) -> None:
    assert httpx.get(f"{keyed_server.base_url}/health").status_code == 200
    client = openai.OpenAI(base_url=f"{keyed_server.base_url}/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model=SERVED_NAME, prompt="hi", max_tokens=1).choices
    stats = httpx.get(f"{keyed_server.base_url}/v1/cache/stats", headers={"X-API-Key": KEY})
    assert stats.status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed_server.base_url}/v1", api_key="bad",
                      max_retries=0).models.list()
