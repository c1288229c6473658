"""The official openai client against a live uvicorn server: completions and chat, streamed
and whole, n / stop / seed / token prompts, usage with cached tokens, info routes."""

from __future__ import annotations

import collections

import httpx
import openai
import pytest
from integration_helpers import SERVED_NAME, assert_server_clean

from prefixcache.integrations.server import BackgroundServer

PROMPT = "def add(a, b):\n    return a + b\n# tools: search, calculator, weather"


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_completion_usage_reports_cached_tokens_on_repeat(client, server) -> None:
    first = client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=4,
                                      temperature=0)
    second = client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=4,
                                       temperature=0)
    assert first.object == "text_completion" and first.choices[0].finish_reason == "length"
    assert first.usage.completion_tokens == 4
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    block_size = 4
    full_blocks = (first.usage.prompt_tokens - 1) // block_size * block_size
    assert second.usage.prompt_tokens_details.cached_tokens >= full_blocks > 0
    assert second.choices[0].text == first.choices[0].text
    assert_server_clean(server.base_url)


def test_n_samples_seed_and_token_prompts(client, server) -> None:
    tokens = httpx.post(f"{server.base_url}/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    kwargs = dict(model=SERVED_NAME, max_tokens=6, temperature=1.0, seed=7, n=3)
    by_text = client.completions.create(prompt=PROMPT, **kwargs)
    by_ids = client.completions.create(prompt=tokens, **kwargs)
    assert [c.index for c in by_text.choices] == [0, 1, 2]
    assert [c.text for c in by_text.choices] == [c.text for c in by_ids.choices]
    assert by_text.usage.completion_tokens == 18
    assert_server_clean(server.base_url)


def test_several_prompts_index_choices_per_prompt(client, server) -> None:
    texts = client.completions.create(model=SERVED_NAME, prompt=["one two", "three"],
                                      max_tokens=2, n=2, temperature=0)
    assert sorted(c.index for c in texts.choices) == [0, 1, 2, 3]
    assert texts.usage.completion_tokens == 8
    ids = client.completions.create(model=SERVED_NAME, prompt=[[5, 6, 7], [8, 9]],
                                    max_tokens=2, temperature=0)
    assert sorted(c.index for c in ids.choices) == [0, 1] and ids.usage.prompt_tokens == 5
    assert_server_clean(server.base_url)


def test_stop_string_ends_the_completion(client, server) -> None:
    base = client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=12,
                                     temperature=1.0, seed=3)
    text = base.choices[0].text
    stop = next((ch for ch in text[1:] if ch.strip()), None)
    if stop is None:
        pytest.skip("the random model produced no printable text for this seed")
    stopped = client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=12,
                                        temperature=1.0, seed=3, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop, 1)]


def test_stop_token_ids_and_keeping_the_stop_string(client, server, engine) -> None:
    """vLLM's extra fields: ``stop_token_ids`` ends a completion on any of those ids (here
    every id, so on the first token); ``include_stop_str_in_output`` keeps the stop string."""
    every_id = list(range(engine.llm.config.vocab_size))
    kwargs = dict(model=SERVED_NAME, prompt=PROMPT, max_tokens=6, temperature=0)
    first = client.completions.create(**kwargs, extra_body={"stop_token_ids": every_id})
    assert first.choices[0].finish_reason == "stop" and first.usage.completion_tokens == 1
    unstopped = client.completions.create(**kwargs, extra_body={"stop_token_ids": []})
    assert unstopped.choices[0].finish_reason == "length"
    assert unstopped.usage.completion_tokens == 6
    text = unstopped.choices[0].text
    stop = next((ch for ch in text[1:] if ch.strip()), None)
    if stop is None:
        pytest.skip("the random model produced no printable text here")
    kept = client.completions.create(**kwargs, stop=[stop],
                                     extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].finish_reason == "stop"
    assert kept.choices[0].text == text[: text.index(stop, 1) + len(stop)]
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(**kwargs, extra_body={"stop_token_ids": [-1]})
    assert refused.value.param == "stop_token_ids"
    assert_server_clean(server.base_url)


def test_streamed_completion_matches_whole_one(client, server) -> None:
    kwargs = dict(model=SERVED_NAME, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=11)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True,
                                            stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    assert_server_clean(server.base_url)


STAGGERED = dict(model=SERVED_NAME, max_tokens=30, n=3, seed=0, stop=["e"], temperature=1.0)
"""Three samples that hit the stop string after different numbers of tokens (checked)."""


def _texts_and_finishes(choices: list) -> tuple[dict[int, str], dict[int, list[str | None]]]:
    """Per choice index: the streamed text, and the finish_reason of every chunk in order."""
    texts: dict[int, str] = collections.defaultdict(str)
    reasons: dict[int, list[str | None]] = collections.defaultdict(list)
    for choice in choices:
        content = choice.text if hasattr(choice, "text") else choice.delta.content
        texts[choice.index] += content or ""
        reasons[choice.index].append(choice.finish_reason)
    return texts, reasons


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_each_streamed_choice_finishes_exactly_once(client, server, kind: str) -> None:
    """A choice that stops early is not finished again with every later snapshot of the
    choices still running: one chunk carries its finish_reason, and it is its last."""
    if kind == "completion":
        create, extra = client.completions.create, {"prompt": "The quick brown fox"}
        whole = {c.index: (c.text, c.finish_reason) for c in create(**STAGGERED, **extra).choices}
    else:
        create = client.chat.completions.create
        extra = {"messages": [{"role": "user", "content": "The quick brown fox"}]}
        whole = {c.index: (c.message.content, c.finish_reason)
                 for c in create(**STAGGERED, **extra).choices}
    assert len({len(text) for text, _ in whole.values()}) > 1, f"not staggered: {whole}"
    chunks = list(create(stream=True, **STAGGERED, **extra))
    texts, reasons = _texts_and_finishes([c for chunk in chunks for c in chunk.choices])
    assert set(reasons) == {0, 1, 2}
    for index, (text, finish_reason) in whole.items():
        assert [r for r in reasons[index] if r] == [finish_reason], (index, reasons[index])
        assert reasons[index][-1] == finish_reason
        assert texts[index] == text
    assert_server_clean(server.base_url)


def test_chat_whole_and_streamed(client, server) -> None:
    messages = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "What is 2 + 2?"}]
    kwargs = dict(model=SERVED_NAME, messages=messages, max_tokens=6, temperature=1.0, seed=5)
    whole = client.chat.completions.create(**kwargs)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens_details is not None
    chunks = list(client.chat.completions.create(stream=True,
                                                 stream_options={"include_usage": True},
                                                 **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    usage = chunks[-1].usage
    assert usage.prompt_tokens == whole.usage.prompt_tokens and usage.completion_tokens == 6
    assert usage.prompt_tokens_details.cached_tokens >= 4
    assert_server_clean(server.base_url)


def test_chat_n_and_max_completion_tokens(client, server) -> None:
    result = client.chat.completions.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": "hi"}], n=2,
        max_completion_tokens=3, temperature=1.0, seed=1)
    assert [c.index for c in result.choices] == [0, 1]
    assert result.usage.completion_tokens == 6


def test_models_health_tokenize_detokenize(client, server) -> None:
    assert [m.id for m in client.models.list().data] == [SERVED_NAME]
    assert client.models.retrieve(SERVED_NAME).id == SERVED_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}
    tokens = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "hello"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0
    text = httpx.post(f"{server.base_url}/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert text == {"prompt": "hello"}
    chat = httpx.post(f"{server.base_url}/tokenize",
                      json={"messages": [{"role": "user", "content": "hello"}]}).json()
    assert chat["count"] > tokens["count"]


def test_metrics_expose_cache_and_latency_series(client, server) -> None:
    client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=2)
    body = httpx.get(f"{server.base_url}/metrics").text
    for name in ("prefixcache_prefix_cache_queries_tokens_total",
                 "prefixcache_prefix_cache_hits_tokens_total", "prefixcache_kv_cache_usage_ratio",
                 "prefixcache_preemptions_total", "prefixcache_prefix_cache_evictions_total",
                 "prefixcache_num_requests_running", "prefixcache_num_requests_waiting",
                 "prefixcache_time_to_first_token_seconds_bucket",
                 "prefixcache_inter_token_latency_seconds_bucket",
                 "prefixcache_e2e_request_latency_seconds_count"):
        assert name in body, name
    hits = next(line for line in body.splitlines()
                if line.startswith("prefixcache_prefix_cache_hits_tokens_total "))
    assert float(hits.split()[1]) > 0


def test_chat_with_tool_messages_and_content_parts(client, server) -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "weather in Oslo?"}]},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call-1", "type": "function",
            "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call-1", "content": '{"sky":"snow"}'},
    ]
    # the tools themselves, whose instructions outgrow this model's 512 tokens, are in
    # test_server_tools.py
    reply = client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=2)
    assert reply.usage.completion_tokens == 2
    assert_server_clean(server.base_url)


def test_penalties_logit_bias_and_min_tokens(client, server) -> None:
    """OpenAI's penalties and logit bias, vLLM's repetition_penalty / min_p / min_tokens: a
    bias of 100 forces its token; each bad value is a 400 naming its field."""
    forced = client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=5,
                                       temperature=0.0, logit_bias={"42": 100},
                                       extra_body={"ignore_eos": True})
    token = httpx.post(f"{server.base_url}/detokenize", json={"tokens": [42]}).json()["prompt"]
    assert forced.choices[0].text == token * 5
    reply = client.chat.completions.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
        temperature=0.7, seed=3, presence_penalty=0.5, frequency_penalty=1.0,
        extra_body={"repetition_penalty": 1.3, "min_p": 0.1, "min_tokens": 6})
    assert reply.usage.completion_tokens == 6
    for field, value in [("presence_penalty", 2.5), ("frequency_penalty", -3.0),
                         ("repetition_penalty", 0), ("min_p", 1.5), ("min_tokens", 7),
                         ("logit_bias", {"x": 1}), ("logit_bias", {"999999": 1}),
                         ("logit_bias", {"5": 101})]:
        with pytest.raises(openai.BadRequestError) as raised:
            client.completions.create(model=SERVED_NAME, prompt="x", max_tokens=6,
                                      extra_body={field: value})
        assert raised.value.param == field, (field, value, raised.value.message)
    assert_server_clean(server.base_url)
