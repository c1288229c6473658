"""Text the server cannot or need not tokenize: invalid Unicode answers 400, bodies over the
size cap 413, text that cannot fit the context is refused without tokenizing it, and long
text is tokenized without stalling other requests. /tokenize counts over-long text."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import httpx
import pytest
from integration_helpers import SERVED_NAME, assert_openai_error, assert_server_clean

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.integrations.server import BackgroundServer, build_app
from prefixcache.integrations.server.limits import RequestLimits

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
    ("/v1/chat/completions", r'{"messages": [{"role": "user", "content": "x", '
     r'"name": "\ud800"}], "max_tokens": 2}', "messages"),
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
    limit = RequestLimits.for_model(MAX_MODEL_LEN).max_body_bytes
    assert limit == max(1 << 20, 32 * 16 * MAX_MODEL_LEN)  # 32 bytes a token of 16 contexts
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
    """The same engine behind a 64 MiB body cap and a prompt-token cap of 16 M, so huge
    prompts reach the routes."""
    app = build_app(engine, model_name=SERVED_NAME, max_body_bytes=64 << 20,
                    max_prompt_tokens=1 << 24)
    with BackgroundServer(app) as running:
        yield running


class EncodeSpy:
    """Stands in for the engine tokenizer's ``encode``: records the length of every text it
    is given and, for a text of at least ``hold_chars`` characters, calls ``while_held``
    before encoding it (with the real encode's answer after)."""

    def __init__(self, encode: Callable[[str], list[int]], hold_chars: int,
                 while_held: Callable[[], None] = lambda: None) -> None:
        self.encode, self.hold_chars, self.while_held = encode, hold_chars, while_held
        self.lengths: list[int] = []

    def __call__(self, text: str, *args, **kwargs) -> list[int]:
        self.lengths.append(len(text))
        if len(text) >= self.hold_chars:
            self.while_held()
        return self.encode(text, *args, **kwargs)


def _post_in_thread(url: str, body: bytes) -> tuple[threading.Thread, list[httpx.Response]]:
    answer: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: answer.append(httpx.post(url, content=body, headers=JSON, timeout=300)))
    sender.start()
    return sender, answer


def test_prompt_too_long_to_fit_is_refused_without_tokenizing(roomy_server, engine,
                                                               monkeypatch) -> None:
    """16 MB of text (millions of tokens) cannot fit 512 tokens whatever it tokenizes to:
    it is refused at once instead of holding the server for its tokenizing."""
    tokenizer = engine.llm.tokenizer
    spy = EncodeSpy(tokenizer.encode, hold_chars=0)
    monkeypatch.setattr(tokenizer, "encode", spy)
    prompt = SENTENCE * 600_000
    response = httpx.post(f"{roomy_server.base_url}/v1/completions", headers=JSON, timeout=300,
                          content=httpx.Request("POST", "/", json={"prompt": prompt,
                                                                  "max_tokens": 1}).content)
    error = assert_openai_error(response, 400, "prompt", "context_length_exceeded")
    assert "at least" in error["message"]
    assert spy.lengths == [], "the text was tokenized before it was refused"


def test_long_text_is_tokenized_off_the_event_loop(roomy_server, engine, monkeypatch) -> None:
    """/tokenize counts any length, so it must tokenize a long text: other requests are
    served meanwhile. The tokenizing waits until /health has been answered, which only a
    free event loop can do; tokenizing on the loop fails the /health request."""
    tokenizer = engine.llm.tokenizer
    entered, health_answered = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        health_answered.wait(timeout=120)

    text = SENTENCE * 100_000  # 2.7 MB, 1.6 million tokens
    spy = EncodeSpy(tokenizer.encode, hold_chars=len(text), while_held=hold)
    monkeypatch.setattr(tokenizer, "encode", spy)
    body = httpx.Request("POST", "/", json={"prompt": text}).content
    sender, answer = _post_in_thread(f"{roomy_server.base_url}/tokenize", body)
    try:
        assert entered.wait(timeout=120), "/tokenize never tokenized the text"
        try:
            health = httpx.get(f"{roomy_server.base_url}/health", timeout=20)
        except httpx.TimeoutException:
            pytest.fail("/health was not answered while the text was tokenized: the "
                        "tokenizing holds the event loop")
        assert health.status_code == 200
    finally:
        health_answered.set()
        sender.join()
    assert answer[0].status_code == 200, answer[0].text
    assert answer[0].json()["count"] == len(tokenizer.encode(text)) > 500_000
    assert spy.lengths.count(len(text)) == 2  # the request's and the check's


def test_prompt_near_the_limit_is_tokenized_and_counted(server: BackgroundServer) -> None:
    """Text long enough for the worker-thread path but not refused by the free bound gets
    its exact count."""
    prompt = SENTENCE * 200  # over 4096 characters, under 512 tokens' worth of bytes
    response = httpx.post(f"{server.base_url}/v1/completions", timeout=30,
                          json={"prompt": prompt, "max_tokens": 1})
    error = assert_openai_error(response, 400, "prompt", "context_length_exceeded")
    count = httpx.post(f"{server.base_url}/tokenize", json={"prompt": prompt}).json()["count"]
    assert f"has {count} tokens" in error["message"]
