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


# ---------------------------------------------------------------- partial_block=True


def test_partial_block_off_by_default(cache: PrefixCache) -> None:
    """Without partial_block the match stops at full blocks, as before."""
    m = cache.match([1, 1, 2, 9])
    assert (m.num_tokens, m.partial_block, m.partial_tokens) == (2, None, 0)


@pytest.mark.parametrize(
    ("query", "full_blocks", "shared"),
    [
        ([1, 1, 2, 9], 1, 1),  # ends inside the node: its next block
        ([1, 1, 2, 2, 3, 9], 2, 1),
        ([1, 9], 0, 1),  # nothing full: a child of the root
        ([1, 1, 9, 9], 1, 0),  # the next block differs at once: no partial hit
        ([*LONG, 3], 3, 0),  # nothing cached after the path
    ],
)
def test_partial_block_shares_the_next_tokens(
    cache: PrefixCache, query: list[int], full_blocks: int, shared: int
) -> None:
    """The cached block right after the full match that agrees with the query's next tokens
    comes back with how many agree, and is held (ref 1) until released."""
    path = cache.match(LONG).block_ids
    cache.release(path)
    m = cache.match(query, partial_block=True)
    assert m.block_ids == path[:full_blocks] and m.num_tokens == full_blocks * BS
    assert m.partial_tokens == shared
    if shared:
        assert m.partial_block == path[full_blocks]
        assert cache.pool.ref[m.partial_block] == 1
        cache.release([m.partial_block])
    else:
        assert m.partial_block is None
    cache.release(m.block_ids)
    assert cache.stats()["in_use"] == 0
    cache.check_invariants()


def test_partial_block_picks_the_child_that_agrees_longest() -> None:
    """Among the children after the match, the one sharing the most leading tokens wins."""
    cache = PrefixCache(16, block_size=4)
    system = [5, 5, 5, 5]
    blocks = {tail[0]: cache_prompt(cache, [*system, *tail])[1] for tail in (
        [1, 2, 3, 4], [2, 2, 3, 4], [2, 2, 9, 4], [3, 3, 3, 3],
    )}  # fmt: skip
    hits = cache.stats()["hit_tokens"]
    m = cache.match([*system, 2, 2, 9, 0, 0], partial_block=True)
    assert m.num_tokens == 4 and m.partial_tokens == 3
    assert m.partial_block not in (blocks[1], blocks[3])
    assert cache.tree.tokens[m.partial_block].tolist() == [2, 2, 9, 4]
    assert cache.stats()["hit_tokens"] == hits + 7
    cache.release([*m.block_ids, m.partial_block])
    cache.check_invariants()


@pytest.mark.parametrize(
    ("max_tokens", "full", "shared"),
    [(2, 0, 2), (3, 0, 3), (4, 4, 0), (5, 4, 1), (7, 4, 3), (8, 8, 0)],
)
def test_partial_block_respects_max_tokens(max_tokens: int, full: int, shared: int) -> None:
    """max_tokens caps the partial tokens too (the engine keeps the last prompt token to
    compute); a partial hit never covers a whole block."""
    cache = PrefixCache(8, block_size=4)
    cache_prompt(cache, [1, 2, 3, 4, 5, 6, 7, 8])
    m = cache.match([1, 2, 3, 4, 5, 6, 7, 8, 9], max_tokens=max_tokens, partial_block=True)
    assert (m.num_tokens, m.partial_tokens) == (full, shared)
    cache.release(m.block_ids if m.partial_block is None else [*m.block_ids, m.partial_block])
    cache.check_invariants()


def test_a_held_partial_block_is_not_evicted() -> None:
    """The partial block's reference keeps it out of eviction until released."""
    cache = PrefixCache(3, block_size=2)
    first, second = cache_prompt(cache, [1, 1, 2, 2])
    m = cache.match([1, 1, 2, 7], partial_block=True)
    assert (m.block_ids, m.partial_block, m.partial_tokens) == ([first], second, 1)
    assert cache.can_allocate(1) and not cache.can_allocate(2)
    cache.release([*m.block_ids, second])
    assert cache.can_allocate(3)
    cache.check_invariants()


def test_a_match_made_without_counting_leaves_the_hit_rate_to_count_query() -> None:
    """count=False moves neither counter; count_query adds what the caller used."""
    cache = PrefixCache(8, block_size=2)
    ids = cache.allocate(2)
    cache.insert([1, 2, 3, 4], ids)
    cache.release(ids)
    before = (cache.query_tokens, cache.hit_tokens)
    match = cache.match([1, 2, 3, 4, 5], count=False)
    assert match.num_tokens == 4 and (cache.query_tokens, cache.hit_tokens) == before
    cache.count_query(5, 4)
    assert (cache.query_tokens, cache.hit_tokens) == (before[0] + 5, before[1] + 4)
    for bad in ((5, 6), (-1, 0), (5, True), (5.0, 1)):
        with pytest.raises(ValueError):
            cache.count_query(*bad)
    cache.release(match.block_ids)
    cache.check_invariants()
