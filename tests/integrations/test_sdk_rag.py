"""RAG middleware: one prefix per retrieved set, cache-aware order, document warming."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration_helpers import assert_no_leak, make_llm

from prefixcache.engine.llm import LLM
from prefixcache.integrations.sdk import (
    APIError,
    Client,
    LocalClient,
    RagMiddleware,
    RagPromptBuilder,
    RetrievedChunk,
    WarmDocumentsError,
)

CHUNKS = [RetrievedChunk(f"doc-{name}", f"Facts about {name}: it is {name}-ish.\r\n")
          for name in ("alpha", "beta", "gamma", "delta")]
A, B, C, D = CHUNKS
TOO_LONG = RetrievedChunk("doc-zz-long", "The quick brown fox. " * 200)  # past the context
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


def test_warm_documents_that_fails_on_a_chunk_leaves_no_pin(local: LocalClient) -> None:
    middleware = RagMiddleware(local, BUILDER)
    with pytest.raises(WarmDocumentsError, match="could not warm chunk 'doc-zz-long'") as raised:
        middleware.warm_documents([TOO_LONG, B, A], pin=True)  # A and B are warmed first
    assert raised.value.chunk_id == TOO_LONG.id and raised.value.pins_left == 0
    assert isinstance(raised.value.__cause__, ValueError)
    assert local.stats()["pinned_nodes"] == 0
    assert local.lookup(messages=BUILDER.prefix_messages([A])) > 0  # warmed, not pinned
    local.reset()
    assert local.lookup(messages=BUILDER.prefix_messages([A])) == 0


def test_a_failed_warm_over_http_releases_only_its_own_pins(server) -> None:
    with Client(server.base_url) as client:
        client.reset()
        own_pin = BUILDER.prefix_messages([A])
        assert client.warm(messages=own_pin, pin=True) > 0  # the caller's pin, kept
        with pytest.raises(WarmDocumentsError, match="doc-zz-long") as raised:
            RagMiddleware(client, BUILDER).warm_documents([A, B, TOO_LONG], pin=True)
        cause = raised.value.__cause__
        assert isinstance(cause, APIError) and cause.code == "context_length_exceeded"
        assert client.stats()["pinned_nodes"] == 1
        client.unpin(messages=own_pin)
        assert client.stats()["pinned_nodes"] == 0
        with pytest.raises(APIError, match="404"):
            client.unpin(messages=own_pin)
        client.reset()
