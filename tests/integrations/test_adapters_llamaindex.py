"""LlamaIndex: the adapter (complete, chat, streaming, cached tokens in ``raw``) and
zero-code ``OpenAILike`` with an api_base against the live server."""

from __future__ import annotations

from pathlib import Path

import pytest
from integration_helpers import (
    SERVED_NAME,
    assert_no_leak,
    assert_server_clean,
    discriminating_stop,
    make_llm,
)

pytest.importorskip("llama_index.core")
from llama_index.core.llms import ChatMessage

from prefixcache.integrations.adapters.llamaindex_llm import PrefixCacheLLM
from prefixcache.integrations.sdk import LocalClient

PROMPT = "A catalogue entry for a very long shelf of books. " * 3


def test_adapter_complete_chat_and_stream(server) -> None:
    llm = PrefixCacheLLM.from_url(server.base_url, max_tokens=4, temperature=0.0)
    assert llm.metadata.model_name == SERVED_NAME and llm.metadata.is_chat_model
    first, second = llm.complete(PROMPT), llm.complete(PROMPT)
    assert first.text == second.text and second.raw["usage"]["cached_tokens"] > 0
    streamed = list(llm.stream_complete(PROMPT))
    assert streamed[-1].text == first.text
    messages = [ChatMessage(role="system", content=PROMPT), ChatMessage(role="user",
                                                                        content="next?")]
    reply = llm.chat(messages)
    assert reply.message.role.value == "assistant"
    assert reply.raw["usage"]["completion_tokens"] == 4
    chat_stream = list(llm.stream_chat(messages))
    assert chat_stream[-1].message.content == reply.message.content
    assert chat_stream[-1].raw["usage"]["cached_tokens"] > 0
    assert_server_clean(server.base_url)


def test_call_keywords_are_honoured_or_refused(server) -> None:
    llm = PrefixCacheLLM.from_url(server.base_url, max_tokens=6)
    greedy = llm.complete(PROMPT, temperature=0.0).text
    sampled = llm.complete(PROMPT, temperature=1.0, seed=3).text
    assert sampled != greedy
    assert llm.complete(PROMPT, temperature=1.0, seed=3, top_p=0.01).text == greedy
    narrow = PrefixCacheLLM.from_url(server.base_url, max_tokens=6, top_p=0.01)
    assert narrow.complete(PROMPT, temperature=1.0, seed=3).text == greedy
    assert narrow.complete(PROMPT, temperature=1.0, seed=3, top_p=1.0).text == sampled
    assert list(llm.stream_complete(PROMPT, temperature=1.0, seed=3, top_p=0.01))[-1].text \
        == greedy
    for call in (llm.complete, llm.stream_complete):
        with pytest.raises(TypeError, match=r"does not support the keyword.* top_k"):
            call(PROMPT, top_k=1)
    with pytest.raises(TypeError, match="frequency_penalty"):
        llm.chat([ChatMessage(role="user", content="hi")], frequency_penalty=1.0)
    assert_server_clean(server.base_url)


def test_a_string_stop_is_one_stop_string(tiny_chat_dir: Path) -> None:
    local = make_llm(tiny_chat_dir)
    llm = PrefixCacheLLM(client=LocalClient(local), max_tokens=20, temperature=1.0, seed=0)
    whole = llm.complete(PROMPT).text
    stop = discriminating_stop(whole)
    cut = whole[:whole.index(stop)]
    assert llm.complete(PROMPT, stop=stop).text == cut == llm.complete(PROMPT, stop=[stop]).text
    assert list(llm.stream_complete(PROMPT, stop=stop))[-1].text == cut
    assert_no_leak(local)


def test_zero_code_openai_like(server) -> None:
    openai_like = pytest.importorskip("llama_index.llms.openai_like")
    llm = openai_like.OpenAILike(api_base=f"{server.base_url}/v1", api_key="unused",
                                 model=SERVED_NAME, is_chat_model=True, max_tokens=4,
                                 temperature=0.0, context_window=512)
    reply = llm.chat([ChatMessage(role="user", content=PROMPT)])
    assert reply.message.role.value == "assistant"
    assert reply.raw.usage.completion_tokens == 4
    text = llm.complete(PROMPT)
    assert text.raw.usage.prompt_tokens_details.cached_tokens > 0
    assert_server_clean(server.base_url)
