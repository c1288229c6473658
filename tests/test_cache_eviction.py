"""Eviction: free blocks first, then only evictable leaves, LRU order, lower priority first."""

from __future__ import annotations

import pytest
from cache_reference_model import cache_prompt, snapshot

from prefixcache import CacheFull, PrefixCache

BS = 2
A = [1, 1, 2, 2]
B = [3, 3, 4, 4]


def test_free_blocks_go_before_cached_ones() -> None:
    """While free blocks remain nothing is evicted."""
    cache = PrefixCache(6, block_size=BS)
    cache_prompt(cache, A)
    ids = cache.allocate(4)
    assert cache.lookup(A) == 4
    assert cache.stats()["evictions"] == 0
    assert cache.allocate(1)
    assert cache.lookup(A) == 2
    assert cache.stats()["evictions"] == 1
    cache.release(ids)


def test_only_unreferenced_blocks_are_evicted() -> None:
    """Blocks held by a request stay cached; only ref-0 ones are taken."""
    cache = PrefixCache(4, block_size=BS)
    cache_prompt(cache, A)
    cache_prompt(cache, B)
    held = cache.match(A)
    ids = cache.allocate(2)
    assert cache.lookup(B) == 0
    assert cache.lookup(A) == 4
    assert set(ids).isdisjoint(held.block_ids)
    with pytest.raises(CacheFull):
        cache.allocate(1)


def test_leaves_are_peeled_one_block_at_a_time() -> None:
    """A three-block path is evicted from its deepest block up."""
    cache = PrefixCache(3, block_size=BS)
    path = cache_prompt(cache, [5, 5, 6, 6, 7, 7])
    for expected_len, victim in [(4, path[2]), (2, path[1]), (0, path[0])]:
        assert cache.allocate(1) == [victim]
        assert cache.lookup([5, 5, 6, 6, 7, 7]) == expected_len
        cache.check_invariants()
    assert cache.stats()["evictions"] == 3


def test_referenced_descendant_protects_its_ancestor() -> None:
    """A ref-0 block whose child is in use is cached but not evictable."""
    cache = PrefixCache(2, block_size=BS)
    root, leaf = cache_prompt(cache, A)
    cache.match(A)
    cache.release([root])
    stats = cache.stats()
    assert (stats["cached"], stats["in_use"], stats["free"]) == (1, 1, 0)
    with pytest.raises(CacheFull):
        cache.allocate(1)
    assert cache.reset() == 0
    cache.release([leaf])
    assert cache.reset() == 2


def test_least_recently_used_goes_first() -> None:
    """Of two cached prompts the older one is evicted; a match makes a prompt young."""
    cache = PrefixCache(4, block_size=BS)
    a = cache_prompt(cache, A)
    cache_prompt(cache, B)
    ids = cache.allocate(2)
    assert sorted(ids) == sorted(a)
    assert cache.lookup(B) == 4
    cache.release(ids)
    assert cache.reset() == 2
    cache_prompt(cache, A)
    b = cache_prompt(cache, B)
    cache.release(list(cache.match(A).block_ids))
    assert sorted(cache.allocate(2)) == sorted(b)
    assert cache.lookup(A) == 4


def test_lookup_does_not_refresh_recency() -> None:
    """lookup() is side-effect free: the looked-up prompt is still the oldest."""
    cache = PrefixCache(4, block_size=BS)
    a = cache_prompt(cache, A)
    cache_prompt(cache, B)
    assert cache.lookup(A) == 4
    assert sorted(cache.allocate(2)) == sorted(a)


def test_recency_comes_from_match_and_insert_not_release() -> None:
    """Releasing in another order does not change which prompt was used last."""
    cache = PrefixCache(4, block_size=BS)
    a = cache.allocate(2)
    cache.insert(A, a)
    b = cache.allocate(2)
    cache.insert(B, b)
    cache.release(b)
    cache.release(a)
    assert sorted(cache.allocate(2)) == sorted(a)
    assert cache.lookup(B) == 4


def test_matching_a_prefix_refreshes_only_that_prefix() -> None:
    """A match of two blocks of a three-block path leaves its third block old."""
    cache = PrefixCache(4, block_size=BS)
    long = [5, 5, 6, 6, 7, 7]
    path = cache_prompt(cache, long)
    cache_prompt(cache, [8, 8])
    cache.release(list(cache.match(long[:4]).block_ids))
    assert cache.allocate(1) == [path[2]]
    assert cache.lookup([8, 8]) == 2


def test_inserting_a_prefix_refreshes_only_that_prefix() -> None:
    """An insert covering two blocks of a three-block path leaves its third block old."""
    cache = PrefixCache(6, block_size=BS)
    long = [5, 5, 6, 6, 7, 7]
    path = cache_prompt(cache, long)
    cache_prompt(cache, [8, 8])
    ids = cache.allocate(2)
    assert cache.insert(long[:4], ids) == 0
    cache.release(ids)
    evicted = set(cache.allocate(3)) - set(ids)
    assert evicted == {path[2]}
    assert cache.lookup([8, 8]) == 2


def test_insert_of_a_cached_prompt_refreshes_it() -> None:
    """insert() counts as a use even when it caches nothing new."""
    cache = PrefixCache(6, block_size=BS)
    a = cache_prompt(cache, A)
    b = cache_prompt(cache, B)
    ids = cache.allocate(2)
    assert cache.insert(A, ids) == 0
    cache.release(ids)
    evicted = set(cache.allocate(4)) - set(ids)
    assert evicted == set(b)
    assert cache.match(A).block_ids == a


def test_shared_root_sibling_leaves_in_lru_order() -> None:
    """Two branches under one root: the branch matched last survives."""
    cache = PrefixCache(3, block_size=BS)
    root, a_leaf = cache_prompt(cache, [1, 1, 2, 2])
    _, b_leaf = cache_prompt(cache, [1, 1, 3, 3])
    cache.release(list(cache.match([1, 1, 2, 2]).block_ids))
    assert cache.allocate(1) == [b_leaf]
    assert cache.allocate(1) == [a_leaf]
    assert cache.allocate(1) == [root]


def test_lower_priority_goes_first() -> None:
    """A high-priority prompt outlives a younger low-priority one."""
    cache = PrefixCache(4, block_size=BS)
    cache_prompt(cache, A, priority=1)
    b = cache_prompt(cache, B, priority=0)
    assert sorted(cache.allocate(2)) == sorted(b)
    assert cache.lookup(A) == 4


def test_equal_priority_falls_back_to_lru() -> None:
    """Among prompts of the same priority the least recently used goes."""
    cache = PrefixCache(6, block_size=BS)
    a = cache_prompt(cache, A, priority=2)
    cache_prompt(cache, B, priority=2)
    low = cache_prompt(cache, [9, 9, 8, 8], priority=0)
    assert sorted(cache.allocate(2)) == sorted(low)
    assert sorted(cache.allocate(2)) == sorted(a)


def test_cache_full_changes_nothing() -> None:
    """free + evictable < n: CacheFull, same stats, same cached set, same refs."""
    cache = PrefixCache(6, block_size=BS, enable_events=True)
    cache_prompt(cache, A)
    held = cache.allocate(2)
    cache.drain_events()
    prompts = [(A, None), (B, None)]
    before = snapshot(cache, prompts)
    with pytest.raises(CacheFull):
        cache.allocate(5)
    assert snapshot(cache, prompts) == before
    assert cache.drain_events() == []
    cache.check_invariants()
    ids = cache.allocate(4)
    assert len(set(ids) | set(held)) == 6
    assert cache.stats()["evictions"] == 2
    cache.release(held + ids)
    with pytest.raises(ValueError):
        cache.release(held)


def test_reset_evicts_every_evictable_block_and_counts_them() -> None:
    """reset() spares in-use and pinned paths and returns how many blocks it evicted."""
    cache = PrefixCache(8, block_size=BS)
    cache_prompt(cache, A)
    cache_prompt(cache, B)
    cache_prompt(cache, [7, 7, 7, 7])
    held = cache.match(A)
    cache.pin([7, 7])
    assert cache.reset() == 3
    assert (cache.lookup(A), cache.lookup(B), cache.lookup([7, 7, 7, 7])) == (4, 0, 2)
    stats = cache.stats()
    assert stats["evictions"] == 3
    assert (stats["free"], stats["in_use"], stats["cached"]) == (5, 2, 1)
    cache.release(list(held.block_ids))
    assert cache.reset() == 2
