"""Salts are isolated namespaces: they never share blocks, hits, pins or hashes."""

from __future__ import annotations

import pytest
from cache_reference_model import cache_prompt

from prefixcache import PrefixCache

BS = 4
PROMPT = list(range(100, 112))  # three full blocks


@pytest.mark.parametrize(("first", "second"), [(None, "a"), ("a", None), ("a", "b"), ("b", "a")])
def test_cached_prompt_misses_in_other_salt(first: str | None, second: str | None) -> None:
    """A prompt cached under one salt is a miss under any other."""
    cache = PrefixCache(16, block_size=BS)
    cache_prompt(cache, PROMPT, salt=first)
    assert cache.lookup(PROMPT, salt=first) == 12
    assert cache.lookup(PROMPT, salt=second) == 0
    m = cache.match(PROMPT, salt=second)
    assert (m.block_ids, m.num_tokens) == ([], 0)


def test_same_tokens_in_two_salts_use_distinct_blocks() -> None:
    """Inserting the same prompt under two salts caches two disjoint sets of blocks."""
    cache = PrefixCache(16, block_size=BS)
    a = cache_prompt(cache, PROMPT, salt="a")
    b = cache_prompt(cache, PROMPT, salt="b")
    assert len(a) == len(b) == 3
    assert not set(a) & set(b)
    assert cache.match(PROMPT, salt="a").block_ids == a
    assert cache.match(PROMPT, salt="b").block_ids == b
    assert cache.stats()["in_use"] == 6


def test_insert_into_other_salt_is_not_deduplicated() -> None:
    """insert() under salt b caches the caller's blocks even if salt a holds the prompt."""
    cache = PrefixCache(16, block_size=BS)
    cache_prompt(cache, PROMPT, salt="a")
    ids = cache.allocate(3)
    assert cache.insert(PROMPT, ids, salt="b") == 3
    assert cache.insert(PROMPT, ids, salt="b") == 0
    cache.release(ids)
    assert cache.stats()["cached"] == 6


def test_eviction_in_one_salt_keeps_the_other() -> None:
    """Blocks in use under one salt protect nothing in the other, and vice versa."""
    cache = PrefixCache(6, block_size=BS)
    cache_prompt(cache, PROMPT, salt="a")
    held = cache.match(PROMPT, salt="a")
    cache_prompt(cache, PROMPT, salt="b")
    assert cache.stats()["free"] == 0
    ids = cache.allocate(3)
    assert set(ids).isdisjoint(held.block_ids)
    assert cache.lookup(PROMPT, salt="b") == 0
    assert cache.lookup(PROMPT, salt="a") == 12


def test_pins_belong_to_their_salt() -> None:
    """A pin under salt a cannot be released under salt b or without a salt."""
    cache = PrefixCache(16, block_size=BS)
    cache_prompt(cache, PROMPT, salt="a")
    cache_prompt(cache, PROMPT, salt="b")
    assert cache.pin(PROMPT, salt="a") == 12
    assert cache.pin(PROMPT, salt="c") == 0
    with pytest.raises(ValueError):
        cache.unpin(PROMPT, salt="b")
    with pytest.raises(ValueError):
        cache.unpin(PROMPT)
    assert cache.reset() == 3
    assert cache.lookup(PROMPT, salt="a") == 12
    assert cache.lookup(PROMPT, salt="b") == 0
    cache.unpin(PROMPT, salt="a")
    assert cache.reset() == 3


def test_block_hashes_depend_on_salt_and_fingerprint() -> None:
    """The hash chain is seeded by (model_fingerprint, salt)."""
    plain = PrefixCache(4, block_size=BS)
    other_model = PrefixCache(4, block_size=BS, model_fingerprint="another-model")
    base = plain.block_hashes(PROMPT)
    assert len(set(base)) == 3
    for salted in (plain.block_hashes(PROMPT, salt="a"), plain.block_hashes(PROMPT, salt="b")):
        assert not set(salted) & set(base)
    assert plain.block_hashes(PROMPT, salt="a") != plain.block_hashes(PROMPT, salt="b")
    assert not set(other_model.block_hashes(PROMPT)) & set(base)
    assert PrefixCache(4, block_size=BS).block_hashes(PROMPT) == base
