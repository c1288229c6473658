"""Bad input answers 4xx with an OpenAI-style error body; the server keeps serving and leaks
no block."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from integration_helpers import SERVED_NAME, assert_openai_error, assert_server_clean, make_llm

from prefixcache.engine.async_llm import AsyncLLM, EngineRequestError
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.integrations.server import BackgroundServer, build_app
from prefixcache.integrations.server.engine_calls import engine_error, snapshots
from prefixcache.integrations.server.errors import ApiError
from prefixcache.integrations.server.metrics import ServerMetrics
from prefixcache.integrations.server.state import ServerState

MAX_MODEL_LEN = 512  # the tiny model's context length
OK_COMPLETION = {"model": SERVED_NAME, "prompt": "hello", "max_tokens": 2}
OK_CHAT = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
CHAT_NO_LIMIT = {key: value for key, value in OK_CHAT.items() if key != "max_tokens"}

BAD_BODIES = [
    # (route, body, status, param, code)
    ("/v1/completions", {**OK_COMPLETION, "max_tokens": "5"}, 400, "max_tokens", None),
    ("/v1/completions", {**OK_COMPLETION, "temperature": "hot"}, 400, "temperature", None),
    ("/v1/completions", {**OK_COMPLETION, "prompt": 12}, 400, "prompt", None),
    ("/v1/completions", {"model": SERVED_NAME, "max_tokens": 2}, 400, "prompt", None),
    ("/v1/completions", {**OK_COMPLETION, "model": "gpt-9"}, 404, "model", "model_not_found"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": "x" * 600}, 400, "prompt",
     "context_length_exceeded"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": list(range(1, MAX_MODEL_LEN + 1))}, 400,
     "prompt", "context_length_exceeded"),
    ("/v1/completions", {**OK_COMPLETION, "prompt": [1, 99999]}, 400, "prompt", None),
    ("/v1/completions", {**OK_COMPLETION, "prompt": ""}, 400, "prompt", None),
    ("/v1/completions", {**OK_COMPLETION, "prompt": []}, 400, "prompt", None),
    ("/v1/completions", {**OK_COMPLETION, "prompt": ["a", ""]}, 400, "prompt", None),
    ("/v1/completions", {**OK_COMPLETION, "prompt": [[1, 2], []]}, 400, "prompt", None),
    ("/v1/completions", {**OK_COMPLETION, "max_tokens": 0}, 400, "max_tokens", None),
    ("/v1/completions", {**OK_COMPLETION, "max_tokens": -3}, 400, "max_tokens", None),
    ("/v1/completions", {**OK_COMPLETION, "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens",
     "context_length_exceeded"),
    ("/v1/completions", {**OK_COMPLETION, "n": 0}, 400, "n", None),
    ("/v1/completions", {**OK_COMPLETION, "n": 1000}, 400, "n", None),
    ("/v1/completions", {**OK_COMPLETION, "temperature": -1.0}, 400, "temperature", None),
    ("/v1/completions", {**OK_COMPLETION, "top_p": 0.0}, 400, "top_p", None),
    ("/v1/completions", {**OK_COMPLETION, "stop": [""]}, 400, "stop", None),
    ("/v1/completions", {**OK_COMPLETION, "seed": 2**64}, 400, "seed", None),
    # integers beyond 64 bits are refused where they enter, naming the field (as vLLM)
    ("/v1/completions", {**OK_COMPLETION, "seed": 2**63}, 400, "seed", None),
    ("/v1/completions", {**OK_COMPLETION, "seed": -(2**63) - 1}, 400, "seed", None),
    ("/v1/completions", {**OK_COMPLETION, "top_k": 2**63}, 400, "top_k", None),
    ("/v1/completions", {**OK_COMPLETION, "max_tokens": 2**64}, 400, "max_tokens", None),
    ("/v1/completions", {**OK_COMPLETION, "n": 2**70}, 400, "n", None),
    ("/v1/completions", {**OK_COMPLETION, "stop_token_ids": [2**63]}, 400, "stop_token_ids",
     None),
    ("/v1/chat/completions", {**CHAT_NO_LIMIT, "max_completion_tokens": 2**63}, 400,
     "max_completion_tokens", None),
    ("/v1/completions", {**OK_COMPLETION, "cache_salt": 42}, 400, "cache_salt", None),
    ("/v1/completions", {**OK_COMPLETION, "cache_salt": ""}, 400, "cache_salt", None),
    ("/v1/completions", {**OK_COMPLETION, "cache_salt": "s" * 1000}, 400, "cache_salt", None),
    ("/v1/chat/completions", {**OK_CHAT, "messages": []}, 400, "messages", None),
    ("/v1/chat/completions", {**OK_CHAT, "messages": [{"content": "no role"}]}, 400,
     "messages", None),
    ("/v1/chat/completions", {**OK_CHAT, "messages": "hi"}, 400, "messages", None),
    # OpenAI's roles only
    ("/v1/chat/completions", {**OK_CHAT, "messages": [{"role": "alien", "content": "x"}]},
     400, "messages", "literal_error"),
    ("/v1/chat/completions", {**OK_CHAT, "messages": [{"role": "", "content": "x"}]},
     400, "messages", "literal_error"),
    ("/v1/chat/completions", {**OK_CHAT, "messages": [{"role": "user", "content": 7}]}, 400,
     "messages", None),
    ("/v1/chat/completions", {**OK_CHAT, "max_tokens": 0}, 400, "max_tokens", None),
    # errors name the field the client sent: chat's max_completion_tokens
    ("/v1/chat/completions", {**CHAT_NO_LIMIT, "max_completion_tokens": 0}, 400,
     "max_completion_tokens", None),
    ("/v1/chat/completions", {**CHAT_NO_LIMIT, "max_completion_tokens": MAX_MODEL_LEN}, 400,
     "max_completion_tokens", "context_length_exceeded"),
    # a blank salt is refused in the body as in the X-Cache-Salt header
    ("/v1/completions", {**OK_COMPLETION, "cache_salt": " "}, 400, "cache_salt",
     "invalid_cache_salt"),
    ("/v1/cache/lookup", {"prompt": "x", "cache_salt": "\t "}, 400, "cache_salt",
     "invalid_cache_salt"),
    # every route that takes messages needs at least one
    ("/tokenize", {"messages": []}, 400, "messages", None),
    ("/v1/cache/warm", {"messages": []}, 400, "messages", None),
    ("/v1/cache/lookup", {"messages": []}, 400, "messages", None),
    ("/v1/chat/completions", {**OK_CHAT, "model": "nope"}, 404, "model", "model_not_found"),
    ("/v1/chat/completions", {**OK_CHAT, "n": -1}, 400, "n", None),
    ("/tokenize", {"prompt": 3}, 400, "prompt", None),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens", None),
    ("/v1/cache/warm", {"prompt": "x", "cache_salt": ""}, 400, "cache_salt", None),
    ("/v1/cache/unpin", {"prompt": "never pinned here"}, 404, "prompt", "not_pinned"),
]


@pytest.mark.parametrize(("route", "body", "status", "param", "code"), BAD_BODIES)
def test_bad_request_body(server: BackgroundServer, route, body, status, param, code) -> None:
    response = httpx.post(f"{server.base_url}{route}", json=body, timeout=30)
    assert_openai_error(response, status, param, code)


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_malformed_json(server: BackgroundServer, route: str) -> None:
    response = httpx.post(f"{server.base_url}{route}", content=b'{"prompt": "x",',
                          headers={"content-type": "application/json"})
    assert_openai_error(response, 400, code="json_invalid")


def test_unknown_route_and_method(server: BackgroundServer) -> None:
    assert_openai_error(httpx.get(f"{server.base_url}/v1/nothing"), 404)
    assert_openai_error(httpx.get(f"{server.base_url}/v1/completions"), 405)


def test_blank_salt_header_is_refused_like_a_blank_body_salt(server: BackgroundServer) -> None:
    # (a header value cannot carry surrounding blanks: HTTP strips them, so " " arrives "")
    response = httpx.post(f"{server.base_url}/v1/completions", json=OK_COMPLETION,
                          headers={"X-Cache-Salt": ""})
    assert_openai_error(response, 400, "cache_salt", "invalid_cache_salt")
    response = httpx.post(f"{server.base_url}/v1/completions",
                          json={**OK_COMPLETION, "cache_salt": " "})
    assert_openai_error(response, 400, "cache_salt", "invalid_cache_salt")
    padded = httpx.post(f"{server.base_url}/v1/completions",
                        json={**OK_COMPLETION, "cache_salt": " tenant "}, timeout=30)
    assert padded.status_code == 200, padded.text  # not blank: a salt like any other


def test_salt_header_and_body_must_agree(server: BackgroundServer) -> None:
    response = httpx.post(f"{server.base_url}/v1/completions",
                          json={**OK_COMPLETION, "cache_salt": "a"},
                          headers={"X-Cache-Salt": "b"})
    assert_openai_error(response, 400, "cache_salt", "invalid_cache_salt")


def test_openai_client_raises_typed_errors(server: BackgroundServer) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="missing", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=SERVED_NAME, max_tokens=0,
                                       messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):  # the stream is refused before it starts
        list(client.completions.create(model=SERVED_NAME, prompt="x", n=0, stream=True))


def test_server_keeps_serving_after_bad_input(server: BackgroundServer) -> None:
    for route, body, *_ in BAD_BODIES:
        httpx.post(f"{server.base_url}{route}", json=body, timeout=30)
    response = httpx.post(f"{server.base_url}/v1/completions", json=OK_COMPLETION, timeout=30)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2
    assert_server_clean(server.base_url)


def test_largest_seed_with_several_samples(server: BackgroundServer) -> None:
    """Sample i draws from seed + i: past the seed range it wraps instead of failing the
    engine for every later request."""
    body = {**OK_CHAT, "seed": 2**63 - 1, "n": 3, "temperature": 1.0}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200 and len(response.json()["choices"]) == 3
    response = httpx.post(f"{server.base_url}/v1/completions", json=OK_COMPLETION, timeout=30)
    assert response.status_code == 200
    assert_server_clean(server.base_url)


def test_unset_max_tokens_fits_a_small_pool(tiny_chat_dir) -> None:
    engine = AsyncLLM(make_llm(tiny_chat_dir, num_blocks=32))  # 128 tokens of KV in all
    try:
        with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as small:
            reply = httpx.post(f"{small.base_url}/v1/chat/completions", timeout=60, json={
                "model": SERVED_NAME, "ignore_eos": True,
                "messages": [{"role": "user", "content": "hi"}]}).json()
            usage = reply["usage"]
            assert reply["choices"][0]["finish_reason"] == "length"
            assert usage["prompt_tokens"] + usage["completion_tokens"] == 128
            too_big = httpx.post(f"{small.base_url}/v1/completions", json={
                "model": SERVED_NAME, "prompt": "hi", "max_tokens": 200})
            assert_openai_error(too_big, 400, "max_tokens")
            too_big = httpx.post(f"{small.base_url}/v1/chat/completions", json={
                **CHAT_NO_LIMIT, "max_completion_tokens": 200})
            assert_openai_error(too_big, 400, "max_completion_tokens")
            assert_server_clean(small.base_url)
    finally:
        engine.shutdown()


def test_pins_that_leave_no_room_refuse_a_request_up_front(tiny_chat_dir) -> None:
    """25 of 32 blocks pinned: a request needing 27 is a 400 before it runs (it used to run,
    be preempted and fail), and the engine keeps serving."""
    engine = AsyncLLM(make_llm(tiny_chat_dir, num_blocks=32))
    try:
        with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as small:
            warm = httpx.post(f"{small.base_url}/v1/cache/warm", timeout=60,
                              json={"prompt": list(range(1, 101)), "pin": True})
            assert warm.status_code == 200, warm.text
            body = {**OK_COMPLETION, "max_tokens": 100, "n": 2, "ignore_eos": True}
            refused = httpx.post(f"{small.base_url}/v1/completions", json=body, timeout=60)
            error = assert_openai_error(refused, 400, "max_tokens", "context_length_exceeded")
            assert "pins hold" in error["message"]
            ok = httpx.post(f"{small.base_url}/v1/completions", json=OK_COMPLETION, timeout=60)
            assert ok.status_code == 200
    finally:
        engine.shutdown()


def test_a_request_the_pool_cannot_finish_is_a_503() -> None:
    error = engine_error(EngineRequestError("request needs more KV blocks than the pool can"))
    assert (error.status, error.code) == (503, "kv_cache_exhausted")


def test_a_stopped_engine_answers_503_not_a_hang(tiny_chat_dir) -> None:
    engine = AsyncLLM(make_llm(tiny_chat_dir, num_blocks=16))
    with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as stopped:
        engine.shutdown()
        for method, path, body in (("GET", "/health", None), ("GET", "/metrics", None),
                                   ("GET", "/v1/cache/stats", None),
                                   ("POST", "/v1/cache/warm", {"prompt": "abc"}),
                                   ("POST", "/v1/completions", OK_COMPLETION)):
            response = httpx.request(method, f"{stopped.base_url}{path}", json=body, timeout=30)
            assert_openai_error(response, 503, code="engine_dead")


def _ended(metrics: ServerMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("prefixcache_request_success_total",
                                              {"finish_reason": reason})
    return value or 0.0


def test_a_request_the_engine_fails_counts_as_error_and_one_closed_early_as_abort(
        tiny_chat_dir) -> None:
    """/metrics' completions by finish reason include the requests that never finished."""
    engine = AsyncLLM(make_llm(tiny_chat_dir, num_blocks=16))
    state = ServerState(engine, SERVED_NAME)
    params = SamplingParams(max_tokens=50, ignore_eos=True, n=2)

    async def close_after_first_snapshot() -> None:
        stream = snapshots(state, [1, 2, 3], params, None)
        first = await anext(stream)
        assert not first.finished
        await stream.aclose()  # as a disconnecting client's stream is

    async def run_on_a_stopped_engine() -> None:
        async for _ in snapshots(state, [1, 2, 3], params, None):
            pass

    try:
        asyncio.run(close_after_first_snapshot())
        assert _ended(state.metrics, "abort") == 2 and _ended(state.metrics, "error") == 0
    finally:
        engine.shutdown()
    with pytest.raises(ApiError) as raised:
        asyncio.run(run_on_a_stopped_engine())
    assert (raised.value.status, raised.value.code) == (503, "engine_dead")
    assert _ended(state.metrics, "error") == 2 and _ended(state.metrics, "abort") == 2
