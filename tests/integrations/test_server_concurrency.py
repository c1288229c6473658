"""Many concurrent streams, disconnects mid-stream, and the bounded admission queue."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest
from engine_gate import EngineGate
from integration_helpers import (
    SERVED_NAME,
    assert_openai_error,
    assert_server_clean,
    counter_value,
    wait_until_clean,
)

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.integrations.server import BackgroundServer, build_app

LONG = {"model": SERVED_NAME, "prompt": "tell me a long story", "max_tokens": 400,
        "ignore_eos": True, "stream": True}


def test_32_concurrent_streaming_clients_complete(server: BackgroundServer) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, int]:
        stream = await client.chat.completions.create(
            model=SERVED_NAME, max_tokens=8, temperature=1.0, seed=i, stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "system", "content": "shared system prompt for every agent"},
                      {"role": "user", "content": f"question number {i}"}])
        finish, usage = None, None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            usage = chunk.usage or usage
        return finish, usage.completion_tokens

    async def all_clients() -> list[tuple[str, int]]:
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x",
                                      max_retries=0) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    results = asyncio.run(all_clients())
    assert results == [("length", 8)] * 32
    assert_server_clean(server.base_url)


def finished_by(http: httpx.Client, reason: str) -> float:
    """The server's count of completions ended with finish reason ``reason``."""
    line = f'prefixcache_request_success_total{{finish_reason="{reason}"}}'
    return counter_value(http.get("/metrics").text, line)


def test_disconnect_mid_stream_frees_blocks(server: BackgroundServer, engine: AsyncLLM) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        for route, body in (("/v1/completions", LONG),
                            ("/v1/chat/completions",
                             {**LONG, "messages": [{"role": "user", "content": "go"}]})):
            length_before, aborts_before = finished_by(http, "length"), finished_by(http, "abort")
            with http.stream("POST", route, json=body) as response:
                lines = response.iter_lines()
                received = [next(lines) for _ in range(6)]
                assert all(not line or line.startswith("data: {") for line in received)
                with EngineGate(engine) as gate:
                    assert gate.stats["running"] == 1 and gate.stats["in_use"] > 0
                    response.close()  # the client leaves mid-stream
            stats = wait_until_clean(server.base_url)
            assert stats["free"] + stats["cached"] == stats["num_blocks"]
            assert finished_by(http, "length") == length_before  # aborted, not run to its end
            assert finished_by(http, "abort") == aborts_before + 1


def test_disconnect_during_whole_response_frees_blocks(server: BackgroundServer,
                                                        engine: AsyncLLM) -> None:
    body = {**LONG, "stream": False}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        length_before, aborts_before = finished_by(http, "length"), finished_by(http, "abort")
        with EngineGate(engine), pytest.raises(httpx.ReadTimeout):
            http.post("/v1/completions", json={**body, "n": 2}, timeout=0.5)  # no step runs
        wait_until_clean(server.base_url)
        assert finished_by(http, "length") == length_before
        assert finished_by(http, "abort") == aborts_before + 2  # both completions


@pytest.fixture()
def one_slot_server(engine: AsyncLLM) -> Iterator[BackgroundServer]:
    with BackgroundServer(build_app(engine, model_name=SERVED_NAME, max_pending=1)) as server:
        yield server


def test_full_queue_answers_429_then_recovers(one_slot_server: BackgroundServer,
                                              engine: AsyncLLM) -> None:
    base = one_slot_server.base_url
    with httpx.Client(base_url=base, timeout=30) as http:
        with EngineGate(engine), http.stream("POST", "/v1/completions", json=LONG):
            # the stream holds the only slot: the engine cannot step while the gate is shut
            refused = http.post("/v1/completions", json={**LONG, "stream": False})
            assert_openai_error(refused, 429, code="queue_full")
            assert_openai_error(http.post("/v1/cache/warm", json={"prompt": "abc"}), 429)
        wait_until_clean(base)
        done = http.post("/v1/completions", json={**LONG, "stream": False, "max_tokens": 2})
        assert done.status_code == 200
        metrics = http.get("/metrics").text
        assert "prefixcache_request_rejected_total 2.0" in metrics
    assert_server_clean(base)
