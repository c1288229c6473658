"""LangChain: the adapter (invoke, stream, usage with cache_read) on HTTP and in process, and
zero-code ``ChatOpenAI`` with a base_url against the live server."""

from __future__ import annotations

from pathlib import Path

import pytest
from integration_helpers import SERVED_NAME, assert_no_leak, assert_server_clean, make_llm

pytest.importorskip("langchain_core")
from langchain_core.messages import HumanMessage, SystemMessage

from prefixcache.integrations.adapters.langchain_chat import PrefixCacheChatModel
from prefixcache.integrations.sdk import LocalClient

MESSAGES = [SystemMessage("You are a librarian. " * 4), HumanMessage("Recommend a book.")]


def check_model(chat: PrefixCacheChatModel) -> None:
    first = chat.invoke(MESSAGES)
    second = chat.invoke(MESSAGES)
    assert first.content == second.content
    assert first.usage_metadata["output_tokens"] == 4
    assert second.usage_metadata["input_token_details"]["cache_read"] > 0
    chunks = list(chat.stream(MESSAGES))
    assert "".join(c.content for c in chunks) == first.content
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert total.usage_metadata["input_tokens"] == first.usage_metadata["input_tokens"]
    assert total.usage_metadata["input_token_details"]["cache_read"] > 0
    # one chunk carries the finish reason, so merging the chunks does not repeat it
    assert [c.response_metadata.get("finish_reason") for c in chunks].count("length") == 1
    assert total.response_metadata["finish_reason"] == "length"
    assert first.response_metadata["finish_reason"] == "length"


def test_adapter_over_http(server) -> None:
    chat = PrefixCacheChatModel.from_url(server.base_url, max_tokens=4, temperature=0.0)
    check_model(chat)
    assert_server_clean(server.base_url)


def test_adapter_in_process(tiny_chat_dir: Path) -> None:
    llm = make_llm(tiny_chat_dir)
    check_model(PrefixCacheChatModel(client=LocalClient(llm), max_tokens=4, temperature=0.0))
    assert_no_leak(llm)


def test_zero_code_chat_openai(server) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    chat = langchain_openai.ChatOpenAI(base_url=f"{server.base_url}/v1", api_key="unused",
                                       model=SERVED_NAME, max_tokens=4, temperature=0,
                                       stream_usage=True)
    chat.invoke(MESSAGES)
    reply = chat.invoke(MESSAGES)
    assert reply.usage_metadata["input_token_details"]["cache_read"] > 0
    streamed = list(chat.stream(MESSAGES))
    assert "".join(c.content for c in streamed) == reply.content
    assert_server_clean(server.base_url)
