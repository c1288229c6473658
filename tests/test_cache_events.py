"""KV events: BlockStored / BlockRemoved describe exactly how the cached set changed."""

from __future__ import annotations

from collections import Counter

import pytest
from cache_reference_model import cache_prompt

from prefixcache import BlockRemoved, BlockStored, CacheFull, PrefixCache

BS = 2
LONG = [1, 1, 2, 2, 3, 3]  # three full blocks


def stored_hashes(events: list[object]) -> list[int]:
    """Hashes of all BlockStored events, in order."""
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


def removed_hashes(events: list[object]) -> list[int]:
    """Hashes of all BlockRemoved events, in order."""
    return [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]


def check_stored(events: list[object], tokens: list[int], hashes: list[int], first: int) -> None:
    """events store exactly blocks first.. of tokens, each event chained to its parent."""
    assert events and all(isinstance(e, BlockStored) for e in events)
    assert stored_hashes(events) == hashes[first:]
    parent = hashes[first - 1] if first else None
    start = first * BS
    for event in events:
        assert isinstance(event, BlockStored)
        assert event.parent_block_hash == parent
        assert event.block_size == BS
        end = start + len(event.block_hashes) * BS
        assert list(event.token_ids) == tokens[start:end]
        parent, start = event.block_hashes[-1], end


def test_insert_emits_block_stored_for_new_blocks_only() -> None:
    """Stored events carry the new blocks' hashes, parent hash, tokens and block size."""
    cache = PrefixCache(8, block_size=BS, enable_events=True)
    hashes = cache.block_hashes(LONG)
    cache_prompt(cache, LONG[:2])
    check_stored(cache.drain_events(), LONG, hashes[:1], 0)
    cache_prompt(cache, [*LONG, 9])  # the partial block is never stored
    check_stored(cache.drain_events(), LONG, hashes, 1)


def test_cached_again_emits_nothing() -> None:
    """Inserting an already cached prompt stores nothing; drain clears the queue."""
    cache = PrefixCache(8, block_size=BS, enable_events=True)
    cache_prompt(cache, LONG)
    assert cache.drain_events()
    assert cache.drain_events() == []
    cache_prompt(cache, LONG)
    cache.lookup(LONG)
    cache.pin(LONG)
    cache.unpin(LONG)
    assert cache.drain_events() == []


def test_eviction_emits_block_removed() -> None:
    """Evicted blocks are reported by hash; failed allocations report nothing."""
    cache = PrefixCache(3, block_size=BS, enable_events=True)
    hashes = cache.block_hashes(LONG)
    cache_prompt(cache, LONG)
    cache.drain_events()
    cache.allocate(1)
    assert removed_hashes(cache.drain_events()) == [hashes[2]]
    with pytest.raises(CacheFull):
        cache.allocate(3)
    assert cache.drain_events() == []
    assert cache.reset() == 2
    events = cache.drain_events()
    assert all(isinstance(e, BlockRemoved) for e in events)
    assert sorted(removed_hashes(events)) == sorted(hashes[:2])


def test_ledger_matches_cached_blocks_across_salts() -> None:
    """stored - removed == hashes of the cached blocks, for every salt."""
    cache = PrefixCache(6, block_size=BS, enable_events=True)
    ledger: Counter[int] = Counter()
    prompts = [(LONG, None), (LONG, "t"), ([1, 1, 5, 5], None), ([7, 7, 7, 7], "t")]
    for tokens, salt in prompts * 2:
        cache_prompt(cache, tokens, salt=salt)
        events = cache.drain_events()
        ledger.update(stored_hashes(events))
        ledger.subtract(removed_hashes(events))
        seen = {
            (s, tuple(t[: (i + 1) * BS]))
            for t, s in prompts
            for i in range(cache.lookup(t, salt=s) // BS)
        }
        expected = Counter(cache.block_hashes(list(p), salt=s)[-1] for s, p in seen)
        assert +ledger == expected and -ledger == Counter()
        assert len(seen) == cache.stats()["cached"] + cache.stats()["in_use"]
    assert cache.stats()["evictions"] > 0
