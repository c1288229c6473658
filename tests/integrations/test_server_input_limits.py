"""Text the server cannot or need not tokenize: invalid Unicode answers 400, bodies over the
size cap 413, text that cannot fit the context is refused without tokenizing it, and long
text is tokenized without stalling other requests. /tokenize counts over-long text."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from integration_helpers import SERVED_NAME, assert_openai_error, assert_server_clean

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.integrations.server import BackgroundServer, build_app
from prefixcache.integrations.server.body_limit import default_max_body_bytes

MAX_MODEL_LEN = 512  # the tiny model's context length
SENTENCE = "The quick brown fox jumps. "
JSON = {"content-type": "application/json"}

# Raw bodies: a lone surrogate is valid JSON ("\ud800") but not valid Unicode text.
LONE_SURROGATES = [
    # (route, raw JSON body, param)
    ("/v1/completions", r'{"prompt": "\ud800 lone", "max_tokens": 2}', "prompt"),
    ("/v1/completions", r'{"prompt": ["ok", "\udfff lone"], "max_tokens": 2}', "prompt"),
    ("/v1/completions", r'{"prompt": "ok", "max_tokens": 2, "stop": ["\ud800"]}', "stop"),
    ("/v1/completions",
     r'{"prompt": "ok", "max_tokens": 2, "stop": "\ud800", "stream": true}', "stop"),
    ("/v1/chat/completions",
     r'{"messages": [{"role": "user", "content": "\ud800"}], "max_tokens": 2}', "messages"),
    ("/v1/chat/completions",
     r'{"messages": [{"role": "\ud800", "content": "x"}], "max_tokens": 2}', "messages"),
    ("/v1/chat/completions", r'{"messages": [{"role": "user", "content": '
     r'[{"type": "text", "text": "a\udc00"}]}], "max_tokens": 2}', "messages"),
    ("/tokenize", r'{"prompt": "\ud800 lone"}', "prompt"),
    ("/tokenize", r'{"messages": [{"role": "user", "content": "\ud800"}]}', "messages"),
    ("/v1/cache/warm", r'{"prompt": "\udfff lone"}', "prompt"),
    ("/v1/cache/lookup", r'{"prompt": "\udfff lone"}', "prompt"),
    ("/v1/cache/pin", r'{"messages": [{"role": "user", "content": "\ud800"}]}', "messages"),
    ("/v1/cache/unpin", r'{"prompt": "\ud800"}', "prompt"),
]


@pytest.mark.parametrize(("route", "body", "param"), LONE_SURROGATES)
def test_lone_surrogate_is_a_400(server: BackgroundServer, route, body, param) -> None:
    response = httpx.post(f"{server.base_url}{route}", content=body, headers=JSON, timeout=30)
    error = assert_openai_error(response, 400, param, "string_unicode")
    assert "lone surrogate" in error["message"], error
    assert_server_clean(server.base_url)


def test_surrogate_error_names_the_prompt_and_message_field(server: BackgroundServer) -> None:
    batch = httpx.post(f"{server.base_url}/v1/completions", headers=JSON, timeout=30,
                       content=r'{"prompt": ["ok", "ab\ud800"], "max_tokens": 2}')
    assert assert_openai_error(batch, 400)["message"].startswith("prompt[1]: ")
    chat = httpx.post(f"{server.base_url}/v1/chat/completions", headers=JSON, timeout=30,
                      content=r'{"messages": [{"role": "user", "content": "hi"}, '
                              r'{"role": "user", "content": "\ud800"}]}')
    assert assert_openai_error(chat, 400)["message"].startswith("messages[1].content: ")


def test_tokenize_counts_text_longer_than_the_context(server: BackgroundServer) -> None:
    """Counting an over-long text is what /tokenize is for: the same answer for a prompt
    and for messages, with max_model_len to compare against."""
    text = SENTENCE * 100
    by_prompt = httpx.post(f"{server.base_url}/tokenize", json={"prompt": text}, timeout=30)
    by_messages = httpx.post(f"{server.base_url}/tokenize", timeout=30,
                             json={"messages": [{"role": "user", "content": text}]})
    for response in (by_prompt, by_messages):
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["count"] == len(body["tokens"]) > MAX_MODEL_LEN
        assert body["max_model_len"] == MAX_MODEL_LEN
    assert by_messages.json()["count"] > by_prompt.json()["count"]


def test_body_over_the_size_cap_is_a_413(server: BackgroundServer, engine: AsyncLLM) -> None:
    limit = default_max_body_bytes(MAX_MODEL_LEN, engine.llm.tokenizer)
    assert limit >= 16 * 6 * MAX_MODEL_LEN * engine.llm.tokenizer.max_token_bytes
    over = b'{"max_tokens": 1, "prompt": "' + b"x" * limit + b'"}'
    declared = httpx.post(f"{server.base_url}/v1/completions", content=over, headers=JSON,
                          timeout=60)
    assert_openai_error(declared, 413, code="request_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for start in range(0, len(over), 1 << 16):
            yield over[start:start + (1 << 16)]

    streamed = httpx.post(f"{server.base_url}/v1/completions", content=chunks(), headers=JSON,
                          timeout=60)
    assert_openai_error(streamed, 413, code="request_too_large")
    under = b'{"max_tokens": 1, "prompt": "' + b"x" * (limit - 100) + b'"}'
    refused = httpx.post(f"{server.base_url}/v1/completions", content=under, headers=JSON,
                         timeout=60)
    assert_openai_error(refused, 400, "prompt", "context_length_exceeded")  # read, then judged
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert_server_clean(server.base_url)


@pytest.fixture(scope="module")
def roomy_server(engine: AsyncLLM) -> Iterator[BackgroundServer]:
    """The same engine behind a 64 MiB body cap, so huge prompts reach the routes."""
    app = build_app(engine, model_name=SERVED_NAME, max_body_bytes=64 << 20)
    with BackgroundServer(app) as running:
        yield running


def _worst_health_wait(base_url: str, route: str, body: bytes
                       ) -> tuple[httpx.Response, float, int]:
    """POST ``body`` to ``route`` in a thread while polling /health here; returns its answer,
    the longest time one poll round took (it grows while the server's event loop, or the
    GIL, is held) and the number of polls."""
    answer: list[httpx.Response] = []

    def post() -> None:
        answer.append(httpx.post(f"{base_url}{route}", content=body, headers=JSON,
                                 timeout=300))

    sender = threading.Thread(target=post)
    worst, polls = 0.0, 0
    with httpx.Client(base_url=base_url, timeout=300) as client:
        client.get("/health")  # connect before timing
        sender.start()
        while sender.is_alive():
            started = time.monotonic()
            assert client.get("/health").status_code == 200
            time.sleep(0.01)
            worst, polls = max(worst, time.monotonic() - started), polls + 1
    sender.join()
    return answer[0], worst, polls


def test_prompt_too_long_to_fit_is_refused_without_tokenizing(roomy_server) -> None:
    """16 MB of text (millions of tokens) cannot fit 512 tokens whatever it tokenizes to:
    it is refused at once instead of holding the server for its tokenizing."""
    prompt = SENTENCE * 600_000
    body = httpx.Request("POST", "/", json={"prompt": prompt, "max_tokens": 1}).content
    response, worst, _ = _worst_health_wait(roomy_server.base_url, "/v1/completions", body)
    error = assert_openai_error(response, 400, "prompt", "context_length_exceeded")
    assert "at least" in error["message"]
    assert worst < 1.0, f"/health waited {worst:.2f}s"


def test_long_text_is_tokenized_off_the_event_loop(roomy_server) -> None:
    """/tokenize counts any length, so it must tokenize a long text: other requests are
    served meanwhile."""
    text = SENTENCE * 100_000  # 2.7 MB, 1.6 million tokens
    body = httpx.Request("POST", "/", json={"prompt": text}).content
    response, worst, polls = _worst_health_wait(roomy_server.base_url, "/tokenize", body)
    assert response.status_code == 200 and response.json()["count"] > 500_000
    assert worst < 1.0, f"/health waited {worst:.2f}s"
    assert polls >= 3, "the text was tokenized too fast to tell"


def test_prompt_near_the_limit_is_tokenized_and_counted(server: BackgroundServer) -> None:
    """Text long enough for the worker-thread path but not refused by the free bound gets
    its exact count."""
    prompt = SENTENCE * 200  # over 4096 characters, under 512 tokens' worth of bytes
    response = httpx.post(f"{server.base_url}/v1/completions", timeout=30,
                          json={"prompt": prompt, "max_tokens": 1})
    error = assert_openai_error(response, 400, "prompt", "context_length_exceeded")
    count = httpx.post(f"{server.base_url}/tokenize", json={"prompt": prompt}).json()["count"]
    assert f"has {count} tokens" in error["message"]
