"""OpenAI fields the server does not honour are refused (400, the field named), not dropped;
their neutral values, which clients send by default, are served."""

from __future__ import annotations

import httpx
import openai
import pytest
from integration_helpers import SERVED_NAME, assert_openai_error, assert_server_clean

from prefixcache.integrations.server import BackgroundServer
from prefixcache.integrations.server.errors import ApiError
from prefixcache.integrations.server.unsupported import UNSUPPORTED_CODE, refuse_unsupported

COMPLETION = {"model": SERVED_NAME, "prompt": "hello", "max_tokens": 2}
CHAT = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

REFUSED = [
    ("/v1/completions", COMPLETION, "suffix", "def f():"),
    ("/v1/completions", COMPLETION, "best_of", 3),
]

NEUTRAL = [
    ("/v1/completions", {**COMPLETION, "logprobs": None, "echo": False, "suffix": None,
                         "best_of": 1, "presence_penalty": 0, "frequency_penalty": 0.0,
                         "logit_bias": {}}),
    ("/v1/chat/completions", {**CHAT, "logprobs": False, "top_logprobs": None,
                              "presence_penalty": 0.0, "frequency_penalty": 0,
                              "logit_bias": None, "response_format": {"type": "text"},
                              "user": "someone", "a_field_no_api_has": [1, 2]}),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "auto"}),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "none", "parallel_tool_calls": False}),
]


@pytest.mark.parametrize(("route", "body", "field", "value"), REFUSED)
def test_a_field_the_server_would_leave_out_is_refused(
    server: BackgroundServer, route: str, body: dict, field: str, value: object
) -> None:
    response = httpx.post(f"{server.base_url}{route}", json={**body, field: value}, timeout=30)
    assert_openai_error(response, 400, field, UNSUPPORTED_CODE)
    assert repr(field) in response.json()["error"]["message"]


@pytest.mark.parametrize(("route", "body"), NEUTRAL)
def test_neutral_values_and_unknown_fields_are_served(
    server: BackgroundServer, route: str, body: dict
) -> None:
    response = httpx.post(f"{server.base_url}{route}", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 2
    assert_server_clean(server.base_url)


def test_the_openai_client_gets_a_bad_request_naming_the_field(server: BackgroundServer) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=SERVED_NAME, max_tokens=2, prompt="x", best_of=2)
    assert raised.value.param == "best_of" and raised.value.code == UNSUPPORTED_CODE
    with pytest.raises(openai.BadRequestError, match="suffix"):  # streams too
        list(client.completions.create(model=SERVED_NAME, prompt="x", max_tokens=2,
                                       suffix="y", stream=True))
    assert_server_clean(server.base_url)


def test_neutral_is_decided_by_type_as_well_as_value() -> None:
    refuse_unsupported("completions", {"best_of": 1, "suffix": ""})
    for route, extra in [("completions", {"best_of": 1.0}), ("completions", {"suffix": False})]:
        with pytest.raises(ApiError) as raised:
            refuse_unsupported(route, extra)
        assert raised.value.param == next(iter(extra))
    refuse_unsupported("completions", None)
