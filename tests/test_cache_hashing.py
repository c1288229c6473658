"""block_hashes(): chained 64-bit hashes of the full blocks, from a replaceable hasher."""

from __future__ import annotations

import numpy as np

from prefixcache import PrefixCache

BS = 4
PROMPT = list(range(20, 34))  # three full blocks + 2 tokens


def test_one_hash_per_full_block() -> None:
    """Partial blocks are not hashed; hashes are 64-bit ints."""
    cache = PrefixCache(4, block_size=BS)
    hashes = cache.block_hashes(PROMPT)
    assert len(hashes) == 3
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)
    assert cache.block_hashes(PROMPT[:3]) == []
    assert cache.block_hashes(np.array(PROMPT, dtype=np.int32)) == hashes


def test_hashes_are_chained() -> None:
    """A block's hash depends on everything before it, and only on that."""
    cache = PrefixCache(4, block_size=BS)
    hashes = cache.block_hashes(PROMPT)
    assert cache.block_hashes(PROMPT[:8]) == hashes[:2]
    assert cache.block_hashes([*PROMPT[:8], 0, 0, 0, 0])[:2] == hashes[:2]
    changed_first = cache.block_hashes([99, *PROMPT[1:]])
    assert not set(changed_first) & set(hashes)
    same_block_twice = cache.block_hashes([5, 5, 5, 5, 5, 5, 5, 5])
    assert same_block_twice[0] != same_block_twice[1]


def test_hashes_are_deterministic() -> None:
    """Two caches with the same settings agree (events from one can index another)."""
    a = PrefixCache(4, block_size=BS, model_fingerprint="m")
    b = PrefixCache(64, block_size=BS, model_fingerprint="m")
    assert a.block_hashes(PROMPT, salt="x") == b.block_hashes(PROMPT, salt="x")


def test_custom_block_hasher_is_used() -> None:
    """Every block hash is a value the given block_hasher returned, for bytes-like data."""
    returned: list[int] = []
    seeds: list[object] = []

    def hasher(data: object, seed: int) -> int:
        raw = bytes(memoryview(data))  # type: ignore[arg-type]
        seeds.append(seed)
        value = (hash((raw, seed)) * 2654435761) % 2**64
        returned.append(value)
        return value

    cache = PrefixCache(8, block_size=BS, block_hasher=hasher)
    hashes = cache.block_hashes(PROMPT)
    assert len(hashes) == 3
    assert set(hashes) <= set(returned)
    assert all(isinstance(s, int) for s in seeds)
    # The cache itself still works with it.
    ids = cache.allocate(4)
    assert cache.insert(PROMPT, ids) == 3
    assert cache.lookup(PROMPT) == 12
