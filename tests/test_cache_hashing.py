"""block_hashes(): chained 64-bit hashes of the full blocks, from a replaceable hasher."""

from __future__ import annotations

import numpy as np
import pytest
from cache_reference_model import cache_prompt, internal_state

from prefixcache import PrefixCache, xxh3_block_hasher

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


POISON = 99
"""A token whose blocks the flawed hashers below mishandle; every other block hashes fine."""


def flawed_hasher(bad_result: object) -> object:
    """xxh3, except for blocks holding POISON: those get ``bad_result`` (raised if an
    exception)."""

    def hasher(data: memoryview, seed: int) -> object:
        if POISON in np.frombuffer(data, dtype=np.int32):
            if isinstance(bad_result, Exception):
                raise bad_result
            return bad_result
        return xxh3_block_hasher(data, seed)

    return hasher


FLAWS: list[tuple[object, type[Exception]]] = [
    (-5, ValueError),  # e.g. Python's hash(): negative
    (2**64, ValueError),
    (1.5, TypeError),
    ("12", TypeError),
    (None, TypeError),
    (True, TypeError),
    (RuntimeError("hasher failed"), RuntimeError),
]


@pytest.mark.parametrize(("bad_result", "error"), FLAWS, ids=repr)
@pytest.mark.parametrize(
    ("cached", "insert"),
    [
        ([], [POISON, 1, 2, 3]),  # would create the namespace's root
        ([1, 2, 3, 4, 5, 6], [1, 2, POISON, 4]),  # would split a cached run
        ([1, 2], [1, 2, 3, 4, 5, POISON]),  # would touch the cached path, then fail late
    ],
)
def test_a_flawed_block_hasher_fails_the_insert_with_nothing_changed(
    bad_result: object, error: type[Exception], cached: list[int], insert: list[int]
) -> None:
    """A custom hasher's result must be an unsigned 64-bit int; a bad one (or a hasher that
    raises) fails insert and insert_partial before anything changes, with a clear message."""
    cache = PrefixCache(8, block_size=2, block_hasher=flawed_hasher(bad_result))  # type: ignore[arg-type]
    if cached:
        cache_prompt(cache, cached)
    ids = cache.allocate(3)
    before = internal_state(cache)
    message = "block_hasher|hasher failed"
    with pytest.raises(error, match=message):
        cache.insert(insert, ids)
    assert internal_state(cache) == before
    cache.check_invariants()
    if cached:  # the partial block after the cached full ones
        with pytest.raises(error, match=message):
            cache.insert_partial([*cached, POISON], ids[0])
        assert internal_state(cache) == before
        cache.check_invariants()
    with pytest.raises(error, match=message):
        cache.block_hashes(insert)
    cache.release(ids)
    cache.check_invariants()


def test_a_hasher_returning_numpy_uint64_is_accepted() -> None:
    """numpy unsigned 64-bit results are taken, as plain ints."""
    cache = PrefixCache(
        8, block_size=BS, block_hasher=lambda d, s: np.uint64(xxh3_block_hasher(d, s))
    )
    hashes = cache.block_hashes(PROMPT)
    assert all(type(h) is int for h in hashes)
    assert hashes == PrefixCache(8, block_size=BS).block_hashes(PROMPT)
    cache_prompt(cache, PROMPT)
    assert cache.lookup(PROMPT) == 12
    cache.check_invariants()


@pytest.mark.parametrize("bad", [0, "xxh3", 42.0])
def test_block_hasher_must_be_callable(bad: object) -> None:
    with pytest.raises(TypeError, match="callable"):
        PrefixCache(8, block_size=BS, block_hasher=bad)  # type: ignore[arg-type]
