"""extra_keys: more namespace keys beside the salt (a LoRA id, a modality tag). One canonical
form both names the namespace and is hashed, so equal namespaces always hash alike."""

from __future__ import annotations

import numpy as np
import pytest
from cache_reference_model import cache_prompt, internal_state

from prefixcache import PrefixCache

BS = 2
TOKENS = [1, 2, 3, 4]


def hashes_after_caching(create_with: tuple[object, ...], query: tuple[object, ...]) -> list[int]:
    """block_hashes under ``query`` once a prompt was cached under ``create_with``."""
    cache = PrefixCache(8, block_size=BS)
    ids = cache.allocate(2)
    cache.insert(TOKENS, ids, extra_keys=create_with)  # type: ignore[arg-type]
    cache.check_invariants()
    return cache.block_hashes(TOKENS, extra_keys=query)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spellings",
    [
        [(1,), (np.int64(1),), (np.uint8(1),), [1]],
        [(1.5,), (np.float64(1.5),), [1.5]],
        [(0.0,), (-0.0,)],
        [("lora-a",), ["lora-a"], (np.str_("lora-a"),)],
        [(b"x", None), [b"x", None]],
    ],
    ids=repr,
)
def test_equal_keys_share_one_namespace_and_one_hash(spellings: list[object]) -> None:
    """Every spelling of the same keys finds the same blocks under the same hashes, whichever
    spelling created the namespace (the hash used to follow the creating spelling's repr)."""
    expected = PrefixCache(8, block_size=BS).block_hashes(TOKENS, extra_keys=spellings[0])  # type: ignore[arg-type]
    for create_with in spellings:
        for query in spellings:
            assert hashes_after_caching(create_with, query) == expected  # type: ignore[arg-type]
        cache = PrefixCache(8, block_size=BS)
        ids = cache.allocate(2)
        cache.insert(TOKENS, ids, extra_keys=create_with)  # type: ignore[arg-type]
        for query in spellings:
            assert cache.lookup(TOKENS, extra_keys=query) == 4  # type: ignore[arg-type]
        assert cache.stats()["nodes"] == 2  # one root, one run


@pytest.mark.parametrize("other", [(1.0,), ("1",), (b"1",), (None,), (1, 1), ()], ids=repr)
def test_different_types_are_different_namespaces(other: tuple[object, ...]) -> None:
    """1, 1.0, '1', b'1' and None are distinct keys (with distinct hashes)."""
    cache = PrefixCache(8, block_size=BS)
    cache_prompt_keys(cache, (1,))
    assert cache.lookup(TOKENS, extra_keys=other) == 0  # type: ignore[arg-type]
    assert cache.block_hashes(TOKENS, extra_keys=other) != cache.block_hashes(  # type: ignore[arg-type]
        TOKENS, extra_keys=(1,)
    )
    cache.check_invariants()


def cache_prompt_keys(cache: PrefixCache, extra_keys: tuple[object, ...]) -> None:
    ids = cache.allocate(2)
    cache.insert(TOKENS, ids, extra_keys=extra_keys)  # type: ignore[arg-type]
    cache.release(ids)


BAD_EXTRA_KEYS: list[tuple[object, type[Exception]]] = [
    ("ab", TypeError),  # not split into ('a', 'b')
    (b"ab", TypeError),
    (None, TypeError),
    (5, TypeError),
    ({1}, TypeError),
    (np.array([1, 2]), TypeError),
    ((True,), TypeError),  # True == 1: ambiguous
    ((np.True_,), TypeError),
    (([1],), TypeError),  # unhashable
    (({"a": 1},), TypeError),
    (((1, 2),), TypeError),  # nested: not a plain key
    ((object(),), TypeError),
    ((bytearray(b"x"),), TypeError),
    ((float("nan"),), ValueError),  # NaN equals nothing
    ((float("inf"),), ValueError),
    ((np.float64("-inf"),), ValueError),
]

METHODS = {
    "match": lambda c, k: c.match(TOKENS, extra_keys=k, partial_block=True),
    "lookup": lambda c, k: c.lookup(TOKENS, extra_keys=k, partial_block=True),
    "insert": lambda c, k: c.insert(TOKENS, [0, 1], extra_keys=k),
    "insert_partial": lambda c, k: c.insert_partial([*TOKENS, 5], 2, extra_keys=k),
    "block_hashes": lambda c, k: c.block_hashes(TOKENS, extra_keys=k),
    "pin": lambda c, k: c.pin(TOKENS, extra_keys=k),
    "unpin": lambda c, k: c.unpin(TOKENS, extra_keys=k),
}


@pytest.mark.parametrize(("keys", "error"), BAD_EXTRA_KEYS, ids=repr)
@pytest.mark.parametrize("method", sorted(METHODS))
def test_bad_extra_keys_are_refused_with_nothing_changed(
    keys: object, error: type[Exception], method: str
) -> None:
    """A str is not a list of keys; keys are str, bytes, int, finite float or None."""
    cache = PrefixCache(8, block_size=BS, enable_events=True)
    cache_prompt(cache, TOKENS)
    cache.allocate(3)
    before = internal_state(cache)
    with pytest.raises(error, match="extra"):
        METHODS[method](cache, keys)
    assert internal_state(cache) == before
    cache.check_invariants()


def test_no_extra_keys_hash_as_before() -> None:
    """An empty tuple or list is no extra keys: the default namespace's hashes are unchanged
    (pinned here so that a hash-scheme change is deliberate)."""
    cache = PrefixCache(8, block_size=BS)
    assert cache.block_hashes(TOKENS, extra_keys=[]) == cache.block_hashes(TOKENS)
    assert cache.block_hashes(TOKENS) == [10221838736117160363, 15694972878837475173]
