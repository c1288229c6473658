"""match / lookup / insert on a deterministic scenario: lengths, block ids, refs, counters."""

from __future__ import annotations

import numpy as np
import pytest
from cache_reference_model import cache_prompt

from prefixcache import PrefixCache, PrefixMatch

BS = 2
LONG = [1, 1, 2, 2, 3, 3]  # three full blocks


@pytest.fixture
def cache() -> PrefixCache:
    """LONG cached (three blocks, ref 0) in a pool of eight."""
    cache = PrefixCache(8, block_size=BS)
    cache_prompt(cache, LONG)
    return cache


def test_match_result_shape(cache: PrefixCache) -> None:
    """PrefixMatch(block_ids: list[int], num_tokens = len(block_ids) * block_size)."""
    m = cache.match([*LONG, 4])
    assert isinstance(m, PrefixMatch)
    assert isinstance(m.block_ids, list) and all(type(b) is int for b in m.block_ids)
    assert m.num_tokens == 6 and len(set(m.block_ids)) == 3


@pytest.mark.parametrize(
    ("query", "expected_blocks"),
    [
        ([], 0),
        ([1], 0),
        ([1, 1], 1),
        ([1, 1, 2], 1),
        ([1, 1, 2, 2, 4, 4], 2),
        ([1, 1, 9, 9, 3, 3], 1),
        ([9, 9, 2, 2], 0),
        ([*LONG, 3, 3, 3], 3),
    ],
)
def test_match_is_the_longest_cached_prefix(
    cache: PrefixCache, query: list[int], expected_blocks: int
) -> None:
    """Only full blocks count; the match stops at the first uncached block."""
    path = cache.match(LONG).block_ids
    m = cache.match(query)
    assert m.block_ids == path[:expected_blocks]
    assert m.num_tokens == expected_blocks * BS
    assert cache.lookup(query) == expected_blocks * BS
    assert cache.lookup(np.array(query, dtype=np.int64)) == expected_blocks * BS


@pytest.mark.parametrize(
    ("max_tokens", "expected"), [(0, 0), (1, 0), (3, 2), (4, 4), (6, 6), (99, 6)]
)
def test_max_tokens_caps_the_match(cache: PrefixCache, max_tokens: int, expected: int) -> None:
    """match(max_tokens=k) matches within token_ids[:k]; query_tokens still counts the prompt."""
    before = cache.stats()
    m = cache.match([*LONG, 5], max_tokens=max_tokens)
    assert m.num_tokens == expected
    stats = cache.stats()
    assert stats["query_tokens"] - before["query_tokens"] == 7
    assert stats["hit_tokens"] - before["hit_tokens"] == expected


def test_match_takes_refs_and_counts(cache: PrefixCache) -> None:
    """Each matched block gets one ref; query/hit counters grow; lookup changes nothing."""
    before = cache.stats()
    m1 = cache.match(LONG[:4])
    m2 = cache.match(LONG)
    stats = cache.stats()
    assert stats["in_use"] == 3 and stats["cached"] == 0
    assert stats["query_tokens"] - before["query_tokens"] == 10
    assert stats["hit_tokens"] - before["hit_tokens"] == 10
    assert cache.lookup(LONG) == 6
    assert cache.stats() == stats
    cache.release(m2.block_ids)
    assert cache.stats()["in_use"] == 2
    cache.release(m1.block_ids)
    assert cache.stats()["cached"] == 3
    with pytest.raises(ValueError):
        cache.release(m1.block_ids)


def test_matched_blocks_cannot_be_evicted(cache: PrefixCache) -> None:
    """Held blocks survive any allocation pressure."""
    m = cache.match(LONG)
    ids = cache.allocate(5)
    assert set(ids).isdisjoint(m.block_ids)
    assert cache.lookup(LONG) == 6


def test_insert_counts_only_new_blocks(cache: PrefixCache) -> None:
    """insert() returns how many blocks it newly cached; cached prefixes are not duplicated."""
    path = cache.match(LONG).block_ids
    ids = cache.allocate(4)
    assert cache.insert(LONG, ids[:3]) == 0
    assert cache.insert([*LONG, 4, 4], [*path, ids[3]]) == 1
    assert cache.insert([1, 1, 7, 7, 8, 8], [path[0], ids[0], ids[1]]) == 2
    assert cache.match([1, 1, 7, 7, 8, 8]).block_ids == [path[0], ids[0], ids[1]]
    assert cache.match(LONG).block_ids == path
    stats = cache.stats()
    assert stats["free"] + stats["in_use"] + stats["cached"] == 8
    cache.check_invariants()


def test_uncached_duplicate_keeps_its_refs(cache: PrefixCache) -> None:
    """The caller's block for an already cached prefix stays an ordinary held block."""
    ids = cache.allocate(3)
    assert cache.insert(LONG, ids) == 0
    assert cache.copy_on_write(ids[0]) == (ids[0], None)
    cache.release(ids)
    assert cache.stats()["free"] == 5
