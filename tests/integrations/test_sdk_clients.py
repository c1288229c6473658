"""One interface, three transports: ``Client`` and ``AsyncClient`` over HTTP, ``LocalClient``
in process. Same answers, cached tokens reported, cache control, errors, no leaks."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from engine_gate import EngineGate
from integration_helpers import (
    SERVED_NAME,
    assert_no_leak,
    assert_server_clean,
    discriminating_stop,
    make_llm,
    wait_until_clean,
)

from prefixcache.engine.async_llm import AsyncLLM, EngineDeadError
from prefixcache.engine.llm import LLM
from prefixcache.integrations.sdk import (
    APIError,
    AsyncClient,
    Chunk,
    Client,
    GenerationOptions,
    LocalClient,
    wire,
)
from prefixcache.integrations.server import BackgroundServer, build_app
from prefixcache.integrations.server.errors import ERROR_TYPES

DOC = "a shared document that several calls start with, long enough to fill blocks. " * 2
GREEDY = dict(max_tokens=5, temperature=0.0)


@pytest.fixture(scope="module")
def local_llm(tiny_chat_dir: Path) -> LLM:
    return make_llm(tiny_chat_dir)


@pytest.fixture(params=["http", "local"])
def client(request, server: BackgroundServer, local_llm: LLM) -> Iterator[Client | LocalClient]:
    if request.param == "http":
        with Client(server.base_url) as http_client:
            http_client.reset()
            yield http_client
        assert_server_clean(server.base_url)
    else:
        local_llm.cache.reset()
        yield LocalClient(local_llm, model=SERVED_NAME)
        assert_no_leak(local_llm)


def test_complete_and_chat_report_cached_tokens(client) -> None:
    first = client.complete(DOC, **GREEDY)
    again = client.complete(DOC, **GREEDY)
    assert again.text == first.text and again.usage.prompt_tokens == first.usage.prompt_tokens
    assert first.usage.cached_tokens == 0 < again.usage.cached_tokens
    messages = [{"role": "user", "content": DOC}]
    chat = client.chat(messages, **GREEDY)
    assert chat.usage.completion_tokens == 5 and chat.finish_reason == "length"
    assert client.chat(messages, **GREEDY).usage.cached_tokens > 0


def test_stream_pieces_join_to_the_whole_text(client) -> None:
    options = dict(max_tokens=8, temperature=1.0, seed=4)
    whole = client.complete(DOC, **options)
    chunks = list(client.stream(DOC, **options))
    assert "".join(c.text for c in chunks) == whole.text
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 8
    chat_chunks = list(client.stream(messages=[{"role": "user", "content": "hi"}], **options))
    assert chat_chunks[-1].usage.prompt_tokens > 0


def test_leaving_a_stream_early_frees_its_blocks(client, server) -> None:
    stream = client.stream(DOC, max_tokens=300, temperature=1.0, seed=1)
    next(stream)
    stream.close()
    if isinstance(client, Client):
        wait_until_clean(server.base_url)


def test_warm_pin_lookup_unpin_reset(client) -> None:
    cached = client.warm(DOC, pin=True)
    assert cached > 0 and client.lookup(DOC) == cached
    assert client.stats()["pinned_nodes"] == 1
    client.reset()
    assert client.lookup(DOC) == cached  # pinned blocks survive a reset
    client.unpin(DOC)
    client.reset()
    assert client.lookup(DOC) == 0
    assert client.pin(DOC) == 0
    assert client.warm(messages=[{"role": "system", "content": DOC}], salt="t1") > 0
    assert client.lookup(messages=[{"role": "system", "content": DOC}]) == 0


def test_same_answers_over_http_and_in_process(server, local_llm) -> None:
    with Client(server.base_url) as http_client:
        local = LocalClient(local_llm)
        for options in (GREEDY, dict(max_tokens=6, temperature=0.8, seed=9, n=2)):
            assert http_client.complete(DOC, **options).texts == \
                local.complete(DOC, **options).texts


def test_async_client_mirrors_the_sync_one(server) -> None:
    async def run() -> tuple:
        async with AsyncClient(server.base_url) as client:
            whole = await client.complete(DOC, **GREEDY)
            pieces = [c async for c in client.stream(DOC, **GREEDY)]
            chat = await client.chat([{"role": "user", "content": "hi"}], max_tokens=2)
            warmed = await client.warm(DOC)
            looked = await client.lookup(DOC)
            stats = await client.stats()
            return whole, pieces, chat, warmed, looked, stats

    whole, pieces, chat, warmed, looked, stats = asyncio.run(run())
    assert "".join(p.text for p in pieces) == whole.text
    assert chat.usage.completion_tokens == 2 and warmed == looked > 0
    assert stats["num_blocks"] > 0
    assert_server_clean(server.base_url)


def test_errors_surface_as_api_errors(server, local_llm) -> None:
    with Client(server.base_url) as client:
        with pytest.raises(APIError) as raised:
            client.complete(DOC, max_tokens=0)
        assert raised.value.status == 400 and raised.value.param == "max_tokens"
        with pytest.raises(APIError):
            list(client.stream(DOC, n=0))
        with pytest.raises(APIError, match="404"):
            Client(server.base_url, model="other").complete("x")
    with pytest.raises(ValueError):
        LocalClient(local_llm).complete(DOC, max_tokens=0)
    assert_no_leak(local_llm)


def test_a_string_stop_is_one_stop_string(client) -> None:
    options = dict(max_tokens=20, temperature=1.0, seed=0)
    whole = client.complete(DOC, **options).text
    stop = discriminating_stop(whole)
    cut = whole[:whole.index(stop)]
    as_string = client.complete(DOC, stop=stop, **options)
    assert as_string.text == cut and as_string.finish_reason == "stop"
    assert client.complete(DOC, stop=[stop], **options).text == cut
    assert "".join(c.text for c in client.stream(DOC, stop=stop, **options)) == cut
    assert client.complete(DOC, stop=None, **options).text == whole


def test_generation_options_normalize_stop() -> None:
    assert GenerationOptions(stop="ab").stop == ["ab"]
    assert GenerationOptions(stop=("ab", "c")).stop == ["ab", "c"]
    assert GenerationOptions(stop=None).stop == [] == GenerationOptions().stop
    assert GenerationOptions(stop="ab").openai_fields() == {"stop": ["ab"]}
    assert GenerationOptions(stop="ab").sampling_params(4).stop == ["ab"]
    with pytest.raises(TypeError, match="stop must be a string or a list of strings"):
        GenerationOptions(stop=3)


def stream_summary(chunks: Iterable[Chunk]) -> list[tuple[str, str | None, int | None]]:
    return [(c.text, c.finish_reason, c.usage.completion_tokens if c.usage else None)
            for c in chunks]


@pytest.mark.parametrize("prompt, messages, options", [
    (DOC, None, dict(max_tokens=6, temperature=1.0, seed=3)),
    (None, [{"role": "user", "content": "hi"}], dict(max_tokens=5, temperature=1.0, seed=2)),
    (None, [{"role": "user", "content": "hi"}], dict(max_tokens=5, temperature=1.0, seed=2,
                                                     n=2)),
])
def test_streams_are_the_same_sequence_over_http_and_in_process(
        server, local_llm, prompt, messages, options) -> None:
    with Client(server.base_url) as http_client:
        over_http = list(http_client.stream(prompt, messages=messages, **options))
    in_process = list(LocalClient(local_llm).stream(prompt, messages=messages, **options))
    assert stream_summary(over_http) == stream_summary(in_process)
    for chunks in (over_http, in_process):
        assert [c.finish_reason for c in chunks].count(None) == len(chunks) - 1
        assert chunks[-1].finish_reason == "length"
        assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert over_http[-1].usage.prompt_tokens == in_process[-1].usage.prompt_tokens
    assert_no_leak(local_llm)


def test_async_stream_reports_the_finish_reason_once(server) -> None:
    async def run() -> list[Chunk]:
        async with AsyncClient(server.base_url) as client:
            return [c async for c in client.stream(DOC, max_tokens=4, temperature=1.0, seed=5,
                                                   n=2)]

    chunks = asyncio.run(run())
    assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_an_engine_dying_mid_stream_raises_503(tiny_chat_dir: Path) -> None:
    engine = AsyncLLM(make_llm(tiny_chat_dir))
    try:
        with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as dying, \
                Client(dying.base_url) as client:
            stream = client.stream("hi", max_tokens=300, temperature=0.0)
            assert next(stream).finish_reason is None  # the request is running
            with EngineGate(engine):  # stop the engine between two of its steps
                stopper = threading.Thread(target=engine.shutdown)
                stopper.start()
                with pytest.raises(EngineDeadError):
                    while True:
                        engine.raise_if_dead()
            stopper.join(60)
            with pytest.raises(APIError) as raised:
                list(stream)
    finally:
        engine.shutdown()
    error = raised.value
    assert (error.status, error.error_type, error.code) == (
        503, "service_unavailable", "engine_dead")


def test_stream_error_events_keep_the_status_of_a_whole_response() -> None:
    def raised_by(error: dict) -> APIError:
        with pytest.raises(APIError) as raised:
            wire.parse_event("data: " + json.dumps({"error": error}))
        return raised.value

    for status, error_type in ERROR_TYPES.items():
        error = raised_by({"message": "m", "type": error_type, "param": None, "code": None})
        assert ERROR_TYPES[error.status] == error_type
        assert error.status == (400 if error_type == "invalid_request_error" else status)
    assert raised_by({"message": "m", "type": "BadRequestError", "code": 400}).status == 400
    assert raised_by({"message": "m", "type": "something_else"}).status == 500
