"""Copy-on-write: private uncached blocks are written in place, anything shared is copied."""

from __future__ import annotations

import pytest
from cache_reference_model import cache_prompt

from prefixcache import CacheFull, CopyOp, PrefixCache

BS = 4
PROMPT = list(range(1, 9))  # two full blocks


def test_private_block_is_written_in_place() -> None:
    """ref 1 and not cached: same block, no copy, nothing changes."""
    cache = PrefixCache(4, block_size=BS)
    (block,) = cache.allocate(1)
    before = cache.stats()
    assert cache.copy_on_write(block) == (block, None)
    assert cache.stats() == before
    cache.release([block])
    with pytest.raises(ValueError):
        cache.release([block])


def test_shared_block_is_copied() -> None:
    """ref 2: a new block with ref 1, the old one keeps one ref, and a CopyOp src -> dst."""
    cache = PrefixCache(4, block_size=BS)
    (block,) = cache.allocate(1)
    cache.fork([block])
    new_id, op = cache.copy_on_write(block)
    assert new_id != block
    assert op == CopyOp(src=block, dst=new_id)
    assert (op.src, op.dst) == (block, new_id)
    assert cache.stats()["in_use"] == 2
    # Each of the two now has exactly one ref.
    assert cache.copy_on_write(block) == (block, None)
    assert cache.copy_on_write(new_id) == (new_id, None)
    cache.release([block, new_id])
    assert cache.stats()["free"] == 4
    cache.check_invariants()


def test_cached_block_is_immutable() -> None:
    """A cached block held once is still copied; the original stays cached, now evictable."""
    cache = PrefixCache(4, block_size=BS)
    cache_prompt(cache, PROMPT)
    m = cache.match(PROMPT)
    last = m.block_ids[-1]
    new_id, op = cache.copy_on_write(last)
    assert new_id not in m.block_ids
    assert op == CopyOp(src=last, dst=new_id)
    stats = cache.stats()
    assert (stats["in_use"], stats["cached"], stats["free"]) == (2, 1, 1)
    assert cache.lookup(PROMPT) == 8
    assert cache.match(PROMPT).block_ids == m.block_ids
    cache.check_invariants()


def test_copy_may_evict() -> None:
    """With no free block the copy evicts an evictable one (and counts the eviction)."""
    cache = PrefixCache(3, block_size=BS)
    (victim,) = cache_prompt(cache, PROMPT[:4])
    a, b = cache.allocate(2)
    cache.fork([a])
    new_id, op = cache.copy_on_write(a)
    assert new_id == victim
    assert op == CopyOp(src=a, dst=victim)
    assert cache.lookup(PROMPT) == 0
    assert cache.stats()["evictions"] == 1
    cache.release([a, b, new_id])
    cache.check_invariants()


def test_copy_with_full_pool_raises_cache_full_and_changes_nothing() -> None:
    """No free and no evictable block: CacheFull, same refs, same stats."""
    cache = PrefixCache(2, block_size=BS)
    a, b = cache.allocate(2)
    cache.fork([a])
    before = cache.stats()
    with pytest.raises(CacheFull):
        cache.copy_on_write(a)
    assert cache.stats() == before
    cache.release([a, a, b])
    with pytest.raises(ValueError):
        cache.release([a])


def test_cached_block_copy_with_full_pool_raises_cache_full() -> None:
    """A cached block held once cannot be evicted to make its own copy."""
    cache = PrefixCache(1, block_size=BS)
    (block,) = cache_prompt(cache, PROMPT[:4])
    (held,) = cache.match(PROMPT[:4]).block_ids
    assert held == block
    before = cache.stats()
    with pytest.raises(CacheFull):
        cache.copy_on_write(block)
    assert cache.stats() == before
    assert cache.lookup(PROMPT[:4]) == 4


def test_forked_sequence_writes_its_last_block() -> None:
    """n > 1 samples: forking a sequence then writing its partial block copies only that one."""
    cache = PrefixCache(8, block_size=BS)
    tokens = [*PROMPT, 9, 10]
    blocks = cache.allocate(3)
    cache.insert(tokens, blocks)
    cache.fork(blocks)
    new_id, op = cache.copy_on_write(blocks[2])
    assert op == CopyOp(src=blocks[2], dst=new_id)
    branch = [*blocks[:2], new_id]
    assert cache.copy_on_write(new_id) == (new_id, None)
    assert cache.copy_on_write(blocks[2]) == (blocks[2], None)
    cache.release(branch)
    cache.release(blocks)
    stats = cache.stats()
    assert (stats["cached"], stats["free"], stats["in_use"]) == (2, 6, 0)
