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


SHORT = RetrievedChunk("doc-a", "fox dog")
LONG_B = RetrievedChunk("doc-b", "The quick brown fox jumps over")
LONG_D = RetrievedChunk("doc-d", "Paris is the capital of France.")


def real_cached(client: LocalClient, ordered: list[RetrievedChunk], salt: str | None = None
                ) -> int:
    """Cached tokens of the real prompt (system + context + question) in this order."""
    return client.lookup(messages=BUILDER.messages("what?", ordered), salt=salt)


def test_cache_aware_order_ignores_the_end_of_turn_a_warmed_chunk_ends_with(
        local: LocalClient) -> None:
    """A chunk warmed alone is cached with the template's end of turn after it, which no real
    prompt shares there; scoring it by that would rank a short warmed chunk above a longer
    cached pair."""
    local.chat(BUILDER.messages("q0", [LONG_B, LONG_D]), max_tokens=1)
    RagMiddleware(local, BUILDER).warm_documents([SHORT])
    chunks = [LONG_D, SHORT, LONG_B]
    best = max(real_cached(local, list(p)) for p in itertools.permutations(chunks))
    order = RagMiddleware(local, BUILDER).order(chunks)
    assert order == [LONG_B, LONG_D, SHORT]
    assert real_cached(local, order) == best > real_cached(local, [SHORT, LONG_B, LONG_D])


def test_a_probe_renders_like_the_real_prompt_up_to_the_end_of_its_chunks(
        llm: LLM) -> None:
    probe = llm.render_chat(BUILDER.probe_messages([LONG_B]))
    real = llm.render_chat(BUILDER.messages("q", [LONG_B, LONG_D]))
    content_end = real.index(BUILDER.format_chunk(LONG_D))
    assert probe[:content_end] == real[:content_end]
    assert probe[content_end] != real[content_end]


class SaltRecorder:
    """A client that records the salt of every lookup and chat it passes on."""

    def __init__(self, client: LocalClient) -> None:
        self.client, self.salts = client, []

    def lookup(self, prompt=None, *, messages=None, salt=None) -> int:
        self.salts.append(("lookup", salt))
        return self.client.lookup(prompt, messages=messages, salt=salt)

    def chat(self, messages, **options):
        self.salts.append(("chat", options.get("salt")))
        return self.client.chat(messages, **options)


def test_ask_orders_chunks_under_the_salt_of_the_call(local: LocalClient) -> None:
    local.chat(BUILDER.messages("q0", [D, A]), max_tokens=1, salt="t1")
    unsalted_order = real_cached(local, [A, D], salt="t1")
    recorder = SaltRecorder(local)
    middleware = RagMiddleware(recorder, BUILDER)  # its own salt: None
    assert middleware.order([A, D], salt="t1") == [D, A]
    assert middleware.order([A, D]) == [A, D]  # nothing cached without a salt
    recorder.salts.clear()
    usage = middleware.ask("q1", [A, D], salt="t1", max_tokens=1).usage
    assert set(recorder.salts) == {("lookup", "t1"), ("chat", "t1")}
    assert usage.cached_tokens > unsalted_order
    recorder.salts.clear()
    RagMiddleware(recorder, BUILDER, salt="own").ask("q2", [A], salt=None, max_tokens=1)
    assert set(recorder.salts) == {("lookup", None), ("chat", None)}


def test_canonical_order_keeps_the_first_chunk_of_an_id() -> None:
    first, second = RetrievedChunk("x", "best ranked"), RetrievedChunk("x", "lower ranked")
    assert BUILDER.canonical_order([first, second, A]) == [A, first]


@pytest.mark.parametrize("bad_id", [1, None, ("doc",)])
def test_canonical_order_refuses_ids_that_are_not_strings(bad_id) -> None:
    with pytest.raises(TypeError, match="chunk ids must be str"):
        BUILDER.canonical_order([A, RetrievedChunk(bad_id, "text")])
