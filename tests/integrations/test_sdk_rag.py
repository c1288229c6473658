"""RAG middleware: one prefix per retrieved set, cache-aware order, document warming."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration_helpers import assert_no_leak, make_llm

from prefixcache.engine.llm import LLM
from prefixcache.integrations.sdk import (
    Client,
    LocalClient,
    RagMiddleware,
    RagPromptBuilder,
    RetrievedChunk,
)

CHUNKS = [RetrievedChunk(f"doc-{name}", f"Facts about {name}: it is {name}-ish.\r\n")
          for name in ("alpha", "beta", "gamma", "delta")]
A, B, C, D = CHUNKS
BUILDER = RagPromptBuilder("Answer from the documents.")


@pytest.fixture(scope="module")
def llm(tiny_chat_dir: Path) -> LLM:
    return make_llm(tiny_chat_dir, num_blocks=512)


@pytest.fixture()
def local(llm: LLM) -> Iterator[LocalClient]:
    llm.cache.reset()
    yield LocalClient(llm)
    assert_no_leak(llm)


def test_every_order_of_a_set_gives_one_prompt(local: LocalClient) -> None:
    middleware = RagMiddleware(local, BUILDER, cache_aware=False)
    prompts = {str(middleware.messages("why?", list(order)))
               for order in itertools.permutations([A, B, C])}
    assert len(prompts) == 1
    assert middleware.messages("why?", [A, A, B]) == middleware.messages("why?", [B, A])
    assert "\r" not in str(prompts)


def test_canonical_order_turns_reordered_retrievals_into_hits(local: LocalClient) -> None:
    baseline = RagMiddleware(local, BUILDER, canonical=False)
    canonical = RagMiddleware(local, BUILDER, cache_aware=False)
    baseline.ask("q1", [A, B, C], max_tokens=1)
    miss = baseline.ask("q2", [C, A, B], max_tokens=1).usage
    canonical.ask("q1", [A, B, C], max_tokens=1)
    hit = canonical.ask("q2", [C, A, B], max_tokens=1).usage
    assert hit.cached_tokens > miss.cached_tokens
    shared = local.lookup(messages=BUILDER.prefix_messages([A, B, C]))
    assert hit.cached_tokens >= shared - 4 > 0  # all the context, up to the block boundary


def test_cache_aware_order_extends_the_cached_prefix(local: LocalClient) -> None:
    RagMiddleware(local, BUILDER, canonical=False).ask("first", [C, B], max_tokens=1)
    aware = RagMiddleware(local, BUILDER)
    plain = RagMiddleware(local, BUILDER, cache_aware=False)
    assert plain.order([A, B, C]) == [A, B, C]
    assert aware.order([A, B, C]) == [C, B, A]  # the cached [C, B] first, then the rest
    assert aware.order([A, D]) == [A, D]  # nothing cached: canonical order
    cached_aware = local.lookup(messages=BUILDER.prefix_messages(aware.order([A, B, C])))
    cached_plain = local.lookup(messages=BUILDER.prefix_messages([A, B, C]))
    assert cached_aware > cached_plain


def test_warm_documents_makes_any_first_chunk_a_hit(local: LocalClient, llm: LLM) -> None:
    middleware = RagMiddleware(local, BUILDER, cache_aware=False)
    assert middleware.warm_documents(CHUNKS) > 0
    for chunk in CHUNKS:
        prefix = BUILDER.prefix_messages([chunk])
        assert local.lookup(messages=prefix) >= local.lookup(messages=BUILDER.prefix_messages(
            [])) > 0
    system_only = local.lookup(messages=BUILDER.prefix_messages([]))
    usage = middleware.ask("q", [B, D], max_tokens=1).usage
    chunk_tokens = len(llm.tokenizer.encode(BUILDER.format_chunk(B)))
    assert usage.cached_tokens >= system_only + chunk_tokens - 2 * 4


def test_middleware_over_http_with_a_salt(server) -> None:
    with Client(server.base_url) as client:
        client.reset()
        tenant = RagMiddleware(client, BUILDER, salt="tenant-x")
        tenant.ask("q1", [B, A], max_tokens=1)
        second = tenant.ask("q2", [A, B], max_tokens=1)
        other = RagMiddleware(client, BUILDER, salt="tenant-y").ask("q2", [A, B], max_tokens=1)
    assert second.usage.cached_tokens > 0 and other.usage.cached_tokens == 0
