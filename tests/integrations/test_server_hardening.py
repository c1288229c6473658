"""No single request stops the engine: sampling edge values are served, an engine failure
answers 500 for its request alone, and the server goes on serving (and says so in /metrics)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from integration_helpers import (
    SERVED_NAME,
    assert_openai_error,
    assert_server_clean,
    counter_value,
    make_llm,
    wait_until_clean,
)

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.integrations.server import BackgroundServer, build_app

TINY_TEMPERATURES = [5e-324, 1e-300, 1e-38, 9.99e-6]
ROLES = ["system", "developer", "user", "assistant", "tool"]
POISON = "poison"  # a prompt with this text makes the injected engine fault fire


def _stream_events(response: httpx.Response) -> list[dict | str]:
    events: list[dict | str] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


@pytest.mark.parametrize("temperature", TINY_TEMPERATURES)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_temperature_too_small_to_divide_by_is_greedy(
    server: BackgroundServer, temperature: float, stream: bool, route: str
) -> None:
    """Such a temperature once killed the engine for good (the sampler divided by it)."""
    body = ({"prompt": "Hello"} if route == "/v1/completions"
            else {"messages": [{"role": "user", "content": "Hello"}]})
    body = {**body, "model": SERVED_NAME, "max_tokens": 4, "ignore_eos": True}

    def text(extra: dict) -> str:
        payload = {**body, **extra, "stream": stream}
        with httpx.stream("POST", f"{server.base_url}{route}", json=payload,
                          timeout=60) as response:
            assert response.status_code == 200, response.read()
            if not stream:
                choice = json.loads(response.read())["choices"][0]
                return choice.get("text") or choice["message"]["content"]
            events = _stream_events(response)
        assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1])
        return "".join((c.get("text") or c.get("delta", {}).get("content") or "")
                       for e in events[:-1] for c in e["choices"])

    assert text({"temperature": temperature}) == text({"temperature": 0.0})
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    assert_server_clean(server.base_url)


def test_every_openai_role_is_accepted(server: BackgroundServer) -> None:
    messages = [{"role": role, "content": f"a {role} message"} for role in ROLES]
    response = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
        "model": SERVED_NAME, "messages": messages, "max_tokens": 2})
    assert response.status_code == 200, response.text


@pytest.fixture()
def faulty_server(tiny_chat_dir: Path) -> Iterator[tuple[BackgroundServer, AsyncLLM]]:
    """A server whose engine's forward raises whenever a step holds a prompt with POISON."""
    engine = AsyncLLM(make_llm(tiny_chat_dir))
    runner = engine.llm.engine.runner
    forward = runner._sampled_hidden
    poison = engine.llm.tokenizer.encode(POISON)

    def faulty(out):
        for seq in out.sequences:
            tokens = seq.request.prompt_token_ids
            if any(tokens[i:i + len(poison)] == poison for i in range(len(tokens))):
                raise RuntimeError("injected forward fault")
        return forward(out)

    runner._sampled_hidden = faulty
    try:
        with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as running:
            yield running, engine
    finally:
        engine.shutdown()


def test_an_engine_failure_is_a_500_for_its_request_alone(faulty_server) -> None:
    server, _ = faulty_server
    url = f"{server.base_url}/v1/completions"
    body = {"model": SERVED_NAME, "max_tokens": 6, "ignore_eos": True, "temperature": 0.0}
    alone = httpx.post(url, json={**body, "prompt": "a clean prompt"}, timeout=60).json()
    # a clean prompt batched with a poisoned one in one request: the request answers 500, and
    # its clean sibling (480 tokens to go) is aborted rather than run on unanswered
    mixed = httpx.post(url, timeout=60, json={
        **body, "max_tokens": 480, "prompt": ["a clean prompt", f"a {POISON} prompt"]})
    error = assert_openai_error(mixed, 500, code="internal_error")
    assert "injected forward fault" in error["message"]
    wait_until_clean(server.base_url)
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    assert counter_value(metrics, 'prefixcache_request_success_total{finish_reason="abort"}') \
        == 1
    chat = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
        **body, "messages": [{"role": "user", "content": f"{POISON}!"}], "stream": True})
    events = [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
              for line in chat.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "internal_error"
    again = httpx.post(url, json={**body, "prompt": "a clean prompt"}, timeout=60).json()
    assert again["choices"][0]["text"] == alone["choices"][0]["text"]
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    assert counter_value(metrics, "prefixcache_engine_request_errors_total") == 2
    assert counter_value(metrics, "prefixcache_engine_failed_steps_total") >= 2
    assert counter_value(metrics, 'prefixcache_request_success_total{finish_reason="error"}') \
        == 2
    assert_server_clean(server.base_url)


def test_an_engine_failure_is_logged_with_its_traceback(faulty_server, caplog) -> None:
    server, _ = faulty_server
    with caplog.at_level("ERROR", logger="prefixcache.engine"):
        httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                   json={"model": SERVED_NAME, "max_tokens": 2, "prompt": POISON})
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert failures and failures[0].exc_info is not None
    assert "injected forward fault" in str(failures[0].exc_info[1])
