"""One request's caps (prompts, prompt tokens, body bytes): 4xx naming the limit beyond them,
and within them no request stalls the event loop: /health answers within HEALTH_BOUND_S
while the largest allowed requests are in flight."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from integration_helpers import SERVED_NAME, assert_openai_error, assert_server_clean

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.integrations.server import BackgroundServer, build_app
from prefixcache.integrations.server.limits import RequestLimits

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from health_probe import HealthProbe

MAX_MODEL_LEN = 512  # the tiny model's context length
# /health answers in milliseconds here on an idle machine and once took 0.77 s on a busy host
# (two cores for the server, the test client and the probe). The bound catches a loop held for
# seconds; these requests take 0.1-0.25 s end to end on an idle machine.
HEALTH_BOUND_S = 2.0


@pytest.fixture(scope="module")
def capped(engine: AsyncLLM) -> Iterator[BackgroundServer]:
    app = build_app(engine, model_name=SERVED_NAME, max_prompts=4, max_prompt_tokens=64)
    with BackgroundServer(app) as running:
        yield running


def test_more_prompts_than_allowed_is_a_400(capped: BackgroundServer) -> None:
    url = f"{capped.base_url}/v1/completions"
    body = {"model": SERVED_NAME, "max_tokens": 1}
    error = assert_openai_error(httpx.post(url, json={**body, "prompt": ["a"] * 5}, timeout=30),
                                400, "prompt", "too_many_prompts")
    assert "at most 4" in error["message"]
    assert httpx.post(url, json={**body, "prompt": ["a"] * 4}, timeout=30).status_code == 200
    assert_server_clean(capped.base_url)


@pytest.mark.parametrize(("route", "body", "param", "bound"), [
    ("/v1/completions", {"prompt": [[5] * 30, [6] * 30, [7] * 30]}, "prompt", False),
    ("/v1/completions", {"prompt": ["x" * 600, "y" * 600]}, "prompt", True),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 60}]},
     "messages", False),
    ("/tokenize", {"prompt": "word " * 60}, "prompt", False),
    ("/tokenize", {"prompt": "z" * 100_000}, "prompt", True),
], ids=["ids", "text-floor", "chat", "tokenize", "tokenize-floor"])
def test_more_prompt_tokens_than_allowed_is_a_400(capped: BackgroundServer, route: str,
                                                  body: dict, param: str, bound: bool) -> None:
    response = httpx.post(f"{capped.base_url}{route}", timeout=30,
                          json={"model": SERVED_NAME, "max_tokens": 1, **body})
    error = assert_openai_error(response, 400, param, "too_many_prompt_tokens")
    assert "at most 64 prompt tokens" in error["message"]
    assert ("at least" in error["message"]) == bound  # refused before tokenizing, by a bound
    assert_server_clean(capped.base_url)


def test_default_limits_follow_the_context_length() -> None:
    limits = RequestLimits.for_model(8192)
    assert (limits.max_prompts, limits.max_prompt_tokens) == (256, 16 * 8192)
    assert limits.max_body_bytes == 32 * 16 * 8192  # 4 MiB
    assert RequestLimits.for_model(512).max_body_bytes == 1 << 20  # the 1 MiB floor
    assert RequestLimits.for_model(32768).max_prompt_tokens == 1 << 17  # the default's ceiling
    assert RequestLimits.for_model(200_000).max_prompt_tokens == 200_000  # one full context
    with pytest.raises(ValueError, match="max_prompts"):
        RequestLimits.for_model(512, max_prompts=0)


def _largest_requests(limits: RequestLimits, engine: AsyncLLM) -> list[tuple[str, bytes, int]]:
    """(route, raw body, expected status) of the largest requests each cap lets through: the
    most prompts holding the most tokens (as text, then as ids), the largest body of ids and
    of chat messages (read in full, then refused for their tokens)."""
    per_prompt = limits.max_prompt_tokens // limits.max_prompts
    unit = "ab "
    text = unit * (per_prompt // len(engine.llm.tokenizer.encode(unit)))
    assert len(engine.llm.tokenizer.encode(text)) <= per_prompt
    ids = ",".join(["7"] * ((limits.max_body_bytes - 64) // 2))
    messages = ",".join(['{"role":"user","content":"m"}'] * ((limits.max_body_bytes - 64) // 32))

    def many(prompt: str | list[int]) -> bytes:
        return httpx.Request("POST", "/", json={
            "model": SERVED_NAME, "max_tokens": 1, "prompt": [prompt] * limits.max_prompts,
        }).content

    return [
        ("/v1/completions", many(text), 200),
        ("/v1/completions", many([7] * per_prompt), 200),
        ("/v1/completions", f'{{"max_tokens":1,"prompt":[{ids}]}}'.encode(), 400),
        ("/v1/chat/completions", f'{{"max_tokens":1,"messages":[{messages}]}}'.encode(), 400),
    ]


def test_health_answers_while_the_largest_allowed_requests_run(server: BackgroundServer,
                                                               engine: AsyncLLM) -> None:
    """The default caps of the tiny model's server (256 prompts, 16 contexts of tokens, a body
    of 1 MiB): each request at a cap is parsed, rendered, tokenized and queued while /health
    keeps answering within the bound."""
    limits = RequestLimits.for_model(MAX_MODEL_LEN)
    with HealthProbe(server.base_url) as probe:
        for route, body, status in _largest_requests(limits, engine):
            assert len(body) <= limits.max_body_bytes
            start = time.perf_counter()
            response = httpx.post(f"{server.base_url}{route}", content=body, timeout=300,
                                  headers={"content-type": "application/json"})
            end = time.perf_counter()
            assert response.status_code == status, response.text[:300]
            overlapping = probe.during(start, end)
            assert overlapping, f"no /health request overlapped {route}"
            assert max(overlapping) < HEALTH_BOUND_S, (route, max(overlapping))
    assert probe.statuses == {200}
    assert_server_clean(server.base_url)
