"""Log probabilities through the server and the official client: chat's and completions'
shapes, streamed chunks adding up to the whole answer's, offsets that locate each token in the
text, echo, prompt log probabilities (recomputed, so a cached prompt gets the same), and clear
400s for what is not served."""

from __future__ import annotations

import httpx
import openai
import pytest
from integration_helpers import SERVED_NAME, assert_openai_error, assert_server_clean

from prefixcache.integrations.server import BackgroundServer

MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_chat_logprobs_whole_and_streamed(client: openai.OpenAI, server) -> None:
    common = dict(model=SERVED_NAME, messages=MESSAGES, max_tokens=8, temperature=0,
                  logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})  # fmt: skip
    whole = client.chat.completions.create(**common).choices[0]
    entries = whole.logprobs.content
    assert len(entries) == 8
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == entry.logprob  # greedy: the top token
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    assert b"".join(bytes(e.bytes) for e in entries).decode() == whole.message.content
    streamed = [e for chunk in client.chat.completions.create(**common, stream=True)
                if chunk.choices and chunk.choices[0].logprobs
                for e in chunk.choices[0].logprobs.content]  # fmt: skip
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]
    plain = client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, max_tokens=2)
    assert plain.choices[0].logprobs is None
    assert_server_clean(server.base_url)


def test_completion_logprobs_offsets_and_echo(client: openai.OpenAI, server) -> None:
    reply = client.completions.create(model=SERVED_NAME, prompt="hello", max_tokens=6,
                                      temperature=0, logprobs=2,
                                      extra_body={"ignore_eos": True}).choices[0]  # fmt: skip
    logprobs = reply.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 6
    assert "".join(logprobs.tokens) == reply.text
    for token, offset in zip(logprobs.tokens, logprobs.text_offset, strict=True):
        assert reply.text[offset : offset + len(token)] == token
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    chunks = list(client.completions.create(model=SERVED_NAME, prompt="hello", max_tokens=6,
                                            temperature=0, logprobs=2, stream=True,
                                            extra_body={"ignore_eos": True}))  # fmt: skip
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.tokens]  # fmt: skip
    assert tokens == logprobs.tokens
    echoed, alone = (client.completions.create(model=SERVED_NAME, prompt="hello", max_tokens=3,
                                               temperature=0, echo=echo).choices[0].text
                     for echo in (True, False))  # fmt: skip
    assert echoed == "hello" + alone
    assert_server_clean(server.base_url)


@pytest.mark.parametrize(("route", "extra", "param"), [
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/completions", {"prompt_logprobs": -1}, "prompt_logprobs"),
    ("/v1/chat/completions", {"prompt_logprobs": "2"}, "prompt_logprobs"),
    ("/v1/chat/completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
])  # fmt: skip
def test_what_is_not_served_is_a_400(server: BackgroundServer, route: str, extra: dict,
                                     param: str) -> None:  # fmt: skip
    body = {"model": SERVED_NAME, "max_tokens": 2, **extra}
    body.update({"messages": MESSAGES} if "chat" in route else {"prompt": "hi"})
    response = httpx.post(f"{server.base_url}{route}", json=body, timeout=30)
    assert_openai_error(response, 400, param)


def test_echo_with_logprobs_scores_the_prompt(client: openai.OpenAI, server) -> None:
    prompt = "the cache keeps the prefix"
    common = dict(model=SERVED_NAME, prompt=prompt, max_tokens=4, temperature=0, logprobs=2,
                  echo=True, extra_body={"ignore_eos": True})  # fmt: skip
    reply = client.completions.create(**common).choices[0]
    tokens = httpx.post(f"{server.base_url}/tokenize", json={"model": SERVED_NAME,
                        "prompt": prompt}, timeout=30).json()["tokens"]  # fmt: skip
    logprobs = reply.logprobs
    assert len(logprobs.tokens) == len(tokens) + 4
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs[1:])  # keyed by text
    assert reply.text.startswith(prompt)
    for token, offset in zip(logprobs.tokens, logprobs.text_offset, strict=True):
        assert reply.text[offset : offset + len(token)] == token
    again = client.completions.create(**common).choices[0]  # now a prefix hit: the same
    assert again.logprobs.token_logprobs == logprobs.token_logprobs
    streamed = [c.choices[0].logprobs for c in client.completions.create(**common, stream=True)
                if c.choices and c.choices[0].logprobs]  # fmt: skip
    assert [t for lp in streamed for t in lp.tokens] == logprobs.tokens
    assert [v for lp in streamed for v in lp.token_logprobs] == logprobs.token_logprobs
    assert_server_clean(server.base_url)


def test_prompt_logprobs_on_both_routes(server) -> None:
    body = {"model": SERVED_NAME, "prompt": "one two three four", "max_tokens": 1,
            "prompt_logprobs": 2, "temperature": 0}  # fmt: skip
    first = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
    entries = first["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == first["usage"]["prompt_tokens"]
    for entry in entries[1:]:
        assert 1 <= len(entry) <= 3  # the prompt's token and the top 2 (it may be one of them)
        assert all(v["logprob"] <= 0 and v["decoded_token"] is not None for v in entry.values())
        assert sorted(v["rank"] for v in entry.values())[0] == 1
    second = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # a prefix hit
    assert second["choices"][0]["prompt_logprobs"] == entries
    streamed = httpx.post(f"{server.base_url}/v1/completions", json={**body, "stream": True},
                          timeout=60).text  # fmt: skip
    assert '"prompt_logprobs":[null,' in streamed.replace(" ", "")
    chat = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
        "model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 1,
        "prompt_logprobs": 0}).json()  # fmt: skip
    assert chat["prompt_logprobs"][0] is None
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    assert all(len(e) == 1 for e in chat["prompt_logprobs"][1:])
    assert_server_clean(server.base_url)
