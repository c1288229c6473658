"""Pins: a pinned prefix (its whole path) is never evicted until unpinned; pins count."""

from __future__ import annotations

import pytest
from cache_reference_model import cache_prompt

from prefixcache import CacheFull, PrefixCache

BS = 2
LONG = [1, 1, 2, 2, 3, 3, 4, 4]  # four full blocks


def fresh(num_blocks: int = 4) -> PrefixCache:
    """A pool exactly filled by the cached LONG prompt when num_blocks == 4."""
    cache = PrefixCache(num_blocks, block_size=BS)
    cache_prompt(cache, LONG)
    return cache


def test_pin_returns_cached_length() -> None:
    """pin() pins the cached full-block prefix and returns its length in tokens."""
    cache = fresh()
    assert cache.pin([9, 9, 9]) == 0
    with pytest.raises(ValueError):
        cache.unpin([9, 9, 9])
    assert cache.pin([*LONG[:5], 7, 7]) == 4
    assert cache.pin([*LONG, 5, 5]) == 8
    assert cache.stats()["cached"] == 4


def test_pinned_path_survives_allocation_pressure() -> None:
    """Only blocks below the pinned prefix can go; then CacheFull, changing nothing."""
    cache = fresh()
    assert cache.pin(LONG[:4]) == 4
    ids = cache.allocate(2)
    assert cache.lookup(LONG) == 4
    before = cache.stats()
    with pytest.raises(CacheFull):
        cache.allocate(1)
    assert cache.stats() == before
    cache.release(ids)
    assert cache.reset() == 0
    assert cache.lookup(LONG) == 4


def test_unpin_makes_blocks_evictable_again() -> None:
    """After unpin the whole path is evictable."""
    cache = fresh()
    cache.pin(LONG)
    assert cache.reset() == 0
    cache.unpin(LONG)
    assert cache.reset() == 4
    assert cache.lookup(LONG) == 0
    assert cache.stats()["free"] == 4


def test_pins_count() -> None:
    """pin twice -> unpin twice; the path stays protected until the last unpin."""
    cache = fresh()
    assert cache.pin(LONG) == 8
    assert cache.pin(LONG) == 8
    cache.unpin(LONG)
    assert cache.reset() == 0
    cache.unpin(LONG)
    with pytest.raises(ValueError):
        cache.unpin(LONG)
    assert cache.reset() == 4


def test_unpin_releases_the_deepest_pin() -> None:
    """With pins at 1 and 3 blocks, unpin(LONG) drops the 3-block pin first."""
    cache = fresh()
    assert cache.pin(LONG[:2]) == 2
    assert cache.pin(LONG[:6]) == 6
    cache.unpin(LONG)
    assert cache.reset() == 3
    assert cache.lookup(LONG) == 2
    cache.unpin([*LONG[:2], 8, 8])
    assert cache.reset() == 1


def test_unpin_needs_the_pin_to_be_a_prefix() -> None:
    """A pin deeper than the tokens given is not released by them."""
    cache = fresh()
    cache.pin(LONG[:6])
    with pytest.raises(ValueError):
        cache.unpin(LONG[:4])
    with pytest.raises(ValueError):
        cache.unpin([*LONG[:4], 9, 9, 9, 9])
    cache.unpin([*LONG[:6], 9])


def test_pin_protects_ancestors_not_siblings() -> None:
    """Pinning one branch keeps the shared root; the sibling branch is evictable."""
    cache = PrefixCache(8, block_size=BS)
    a = [1, 1, 2, 2]
    b = [1, 1, 3, 3]
    cache_prompt(cache, a)
    cache_prompt(cache, b)
    cache.pin(a)
    assert cache.reset() == 1
    assert cache.lookup(a) == 4
    assert cache.lookup(b) == 2


def test_pinned_blocks_can_be_matched_and_released() -> None:
    """Refs and pins are independent: a matched pinned block goes back to pinned-cached."""
    cache = fresh()
    cache.pin(LONG)
    m = cache.match(LONG)
    assert m.num_tokens == 8
    assert cache.stats()["in_use"] == 4
    cache.release(list(m.block_ids))
    stats = cache.stats()
    assert (stats["in_use"], stats["cached"]) == (0, 4)
    with pytest.raises(CacheFull):
        cache.allocate(1)


def test_num_pinned_blocks_counts_each_pinned_path_once() -> None:
    """Blocks of every pinned node and of the nodes above it, shared ancestors once; a split
    of a pinned node and an unpin keep the count right."""
    cache = PrefixCache(8, block_size=BS)
    a, b = [1, 1, 2, 2, 3, 3], [1, 1, 4, 4]
    cache_prompt(cache, a)
    cache_prompt(cache, b)
    assert cache.num_pinned_blocks == 0
    cache.pin(a)
    assert cache.num_pinned_blocks == 3
    cache.pin(b)  # shares its first block with a
    assert cache.num_pinned_blocks == 4
    cache.pin(a[:4])  # splits a's node: still the same blocks
    assert (cache.num_pinned_blocks, cache.stats()["pinned_nodes"]) == (4, 3)
    cache.unpin(a)
    assert cache.num_pinned_blocks == 3  # a[:4] and b are still pinned
    cache.unpin(a[:4])
    cache.unpin(b)
    assert (cache.num_pinned_blocks, cache.stats()["pinned_blocks"]) == (0, 0)
    cache.check_invariants()
