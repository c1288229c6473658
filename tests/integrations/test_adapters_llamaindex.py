"""LlamaIndex: the adapter (complete, chat, streaming, cached tokens in ``raw``) and
zero-code ``OpenAILike`` with an api_base against the live server."""

from __future__ import annotations

import pytest
from integration_helpers import SERVED_NAME, assert_server_clean

pytest.importorskip("llama_index.core")
from llama_index.core.llms import ChatMessage

from prefixcache.integrations.adapters.llamaindex_llm import PrefixCacheLLM

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
