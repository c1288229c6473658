"""Every user-caused error of PrefixCache: the exact exception type, and no state change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from cache_reference_model import cache_prompt, snapshot

from prefixcache import PrefixCache

BS = 4
PROMPT = list(range(10, 22))  # three full blocks
OTHER = list(range(50, 58))  # two full blocks

BAD_TYPE_TOKENS: list[object] = [
    [1, 2.0, 3],
    [1, "2"],
    [True, 1, 2],
    [False],
    [[1, 2], [3, 4]],
    [1, None],
    np.array([1.0, 2.0]),
    np.array([True, False]),
    np.array(["a", "b"]),
    "1234",
    12,
    None,
]
BAD_VALUE_TOKENS: list[object] = [
    [1, -1, 2],
    [2**31],
    [0, 2**31 + 5],
    [2**64],
    [-1, 2**63],
    np.array([3, -2], dtype=np.int32),
    np.array([1, 2**31], dtype=np.int64),
]
BAD_SALTS: list[object] = [1, 2.5, b"salt", ["a"], ("a",), object()]

TOKEN_METHODS: dict[str, Callable[[PrefixCache, object, object], object]] = {
    "match": lambda c, t, s: c.match(t, salt=s),
    "lookup": lambda c, t, s: c.lookup(t, salt=s),
    "insert": lambda c, t, s: c.insert(t, list(range(8)), salt=s),
    "pin": lambda c, t, s: c.pin(t, salt=s),
    "unpin": lambda c, t, s: c.unpin(t, salt=s),
    "block_hashes": lambda c, t, s: c.block_hashes(t, salt=s),
}


@pytest.fixture
def cache() -> PrefixCache:
    """A pool with one cached prompt, one pinned prompt and one held block."""
    cache = PrefixCache(16, block_size=BS, enable_events=True)
    cache_prompt(cache, PROMPT)
    cache_prompt(cache, OTHER, salt="s")
    assert cache.pin(OTHER, salt="s") == 8
    cache.allocate(1)
    cache.drain_events()
    return cache


def state(cache: PrefixCache) -> tuple[Any, ...]:
    """Everything a failed call must leave alone (events included)."""
    return snapshot(cache, [(PROMPT, None), (OTHER, "s"), (OTHER, None)]), cache.drain_events()


def assert_rejected(cache: PrefixCache, error: type[Exception], call: Callable[[], object]) -> None:
    """``call`` raises ``error`` and changes nothing observable."""
    before = state(cache)
    with pytest.raises(error):
        call()
    assert state(cache) == before
    cache.check_invariants()


@pytest.mark.parametrize("method", sorted(TOKEN_METHODS))
@pytest.mark.parametrize("tokens", BAD_TYPE_TOKENS, ids=repr)
def test_non_integer_tokens_raise_type_error(
    cache: PrefixCache, method: str, tokens: object
) -> None:
    """Floats, strings, bools, nested lists, non-int arrays and non-sequences are TypeErrors."""
    assert_rejected(cache, TypeError, lambda: TOKEN_METHODS[method](cache, tokens, None))


@pytest.mark.parametrize("method", sorted(TOKEN_METHODS))
@pytest.mark.parametrize("tokens", BAD_VALUE_TOKENS, ids=repr)
def test_out_of_range_tokens_raise_value_error(
    cache: PrefixCache, method: str, tokens: object
) -> None:
    """Negative ids and ids >= 2**31 are ValueErrors."""
    assert_rejected(cache, ValueError, lambda: TOKEN_METHODS[method](cache, tokens, None))


@pytest.mark.parametrize("method", sorted(TOKEN_METHODS))
@pytest.mark.parametrize("salt", BAD_SALTS, ids=repr)
def test_bad_salt_raises_type_error(cache: PrefixCache, method: str, salt: object) -> None:
    """A salt must be None or a str (tokens shorter than a block: nothing else to object to)."""
    assert_rejected(cache, TypeError, lambda: TOKEN_METHODS[method](cache, [1, 2], salt))


@pytest.mark.parametrize("form", ["list", "int32", "int64"])
def test_largest_token_id_and_array_forms_are_accepted(form: str) -> None:
    """2**31 - 1 is a valid id; lists and int32/int64 arrays are the same prompt."""
    cache = PrefixCache(4, block_size=2)
    tokens = [0, 2**31 - 1, 7, 7]
    cache_prompt(cache, tokens)
    query = tokens if form == "list" else np.array(tokens, dtype=form)
    assert cache.lookup(query) == 4
    assert cache.match(query).num_tokens == 4
    assert cache.block_hashes(query) == cache.block_hashes(tokens)


def test_2d_array_is_rejected(cache: PrefixCache) -> None:
    """Only 1-D arrays are token sequences."""
    tokens = np.array([PROMPT[:4], PROMPT[4:8]], dtype=np.int64)
    assert_rejected(cache, (TypeError, ValueError), lambda: cache.match(tokens))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "error"), [(-1, ValueError), (1.5, TypeError), ("2", TypeError), (None, TypeError)]
)
def test_allocate_bad_count(cache: PrefixCache, n: object, error: type[Exception]) -> None:
    """allocate(n) needs an int n >= 0."""
    assert_rejected(cache, error, lambda: cache.allocate(n))  # type: ignore[arg-type]


def test_allocate_zero_is_a_no_op(cache: PrefixCache) -> None:
    """allocate(0) returns no blocks and changes nothing."""
    before = state(cache)
    assert cache.allocate(0) == []
    assert state(cache) == before


def test_insert_needs_a_block_per_full_block(cache: PrefixCache) -> None:
    """Fewer block ids than full blocks is a ValueError."""
    ids = cache.allocate(2)
    assert_rejected(cache, ValueError, lambda: cache.insert(list(range(100, 112)), ids))


@pytest.mark.parametrize("bad", [-1, 16, 10**9])
def test_insert_rejects_invalid_block_ids(cache: PrefixCache, bad: int) -> None:
    """Block ids outside [0, num_blocks) are ValueErrors."""
    ids = cache.allocate(1)
    assert_rejected(cache, ValueError, lambda: cache.insert(list(range(100, 108)), [ids[0], bad]))


def test_insert_rejects_unused_block(cache: PrefixCache) -> None:
    """A block to be newly cached must be in use (ref > 0)."""
    held = cache.allocate(1)
    free = cache.allocate(1)
    cache.release(free)
    assert_rejected(cache, ValueError, lambda: cache.insert(list(range(100, 108)), held + free))


def test_insert_rejects_block_cached_elsewhere(cache: PrefixCache) -> None:
    """A block already caching another prefix cannot cache a second one."""
    m = cache.match(PROMPT)
    held = cache.allocate(1)
    assert_rejected(
        cache, ValueError, lambda: cache.insert(list(range(100, 108)), [held[0], m.block_ids[2]])
    )


def test_insert_rejects_one_block_for_two_new_prefixes(cache: PrefixCache) -> None:
    """The same block cannot be newly cached for two positions of one insert."""
    held = cache.allocate(1)
    assert_rejected(cache, ValueError, lambda: cache.insert(list(range(100, 108)), held * 2))


def test_insert_ignores_extra_block_ids(cache: PrefixCache) -> None:
    """The block of a partial last block is not cached, and any extra id is ignored."""
    tokens = list(range(100, 110))  # 2 full blocks + 2 tokens
    ids = cache.allocate(3)
    assert cache.insert(tokens, ids) == 2
    assert cache.lookup([*tokens, 1, 1]) == 8
    # Held once and not cached: writing into it needs no copy.
    assert cache.copy_on_write(ids[2]) == (ids[2], None)
    cached_before = cache.stats()["cached"]
    cache.release(ids)
    assert cache.stats()["cached"] == cached_before + 2


@pytest.mark.parametrize("bad", [-1, 16, 10**6])
def test_release_unknown_id(cache: PrefixCache, bad: int) -> None:
    """Releasing an unknown block id is a ValueError, even mixed with valid ones."""
    held = cache.allocate(1)
    assert_rejected(cache, ValueError, lambda: cache.release([*held, bad]))
    cache.release(held)


def test_double_free_is_never_silent(cache: PrefixCache) -> None:
    """A release below ref 0 fails as a whole: the valid part is not applied."""
    a, b = cache.allocate(2)
    cache.release([b])
    assert_rejected(cache, ValueError, lambda: cache.release([a, b]))
    assert_rejected(cache, ValueError, lambda: cache.release([a, a]))
    cache.release([a])
    assert_rejected(cache, ValueError, lambda: cache.release([a]))


def test_release_of_cached_unreferenced_block(cache: PrefixCache) -> None:
    """A cached block with ref 0 has no ref to give back."""
    block = cache.match(PROMPT).block_ids[0]
    cache.release([block])
    assert_rejected(cache, ValueError, lambda: cache.release([block]))


def test_fork_needs_blocks_in_use(cache: PrefixCache) -> None:
    """fork() of a ref-0 block or an unknown id is a ValueError and forks nothing."""
    held = cache.allocate(1)
    free = cache.allocate(1)
    cache.release(free)
    assert_rejected(cache, ValueError, lambda: cache.fork([*held, free[0]]))
    assert_rejected(cache, ValueError, lambda: cache.fork([*held, 16]))
    assert_rejected(cache, ValueError, lambda: cache.fork([-1]))
    cache.release(held)
    assert_rejected(cache, ValueError, lambda: cache.release(held))


@pytest.mark.parametrize("bad", [-1, 16])
def test_copy_on_write_unknown_block(cache: PrefixCache, bad: int) -> None:
    """copy_on_write of an unknown block id is a ValueError."""
    assert_rejected(cache, ValueError, lambda: cache.copy_on_write(bad))


@pytest.mark.parametrize("bad", [True, 1.0, "1", None, [1], np.array([1])], ids=repr)
def test_one_block_id_of_the_wrong_type_raises_type_error(cache: PrefixCache, bad: object) -> None:
    """copy_on_write and insert_partial take one integer block id (numpy integers too)."""
    held = cache.allocate(1)
    assert_rejected(cache, TypeError, lambda: cache.copy_on_write(bad))  # type: ignore[arg-type]
    assert_rejected(cache, TypeError, lambda: cache.insert_partial(PROMPT[:3], bad))  # type: ignore[arg-type]
    assert cache.copy_on_write(np.int64(held[0])) == (held[0], None)
    cache.release(held)


def test_copy_on_write_unused_block(cache: PrefixCache) -> None:
    """copy_on_write of a block nobody holds (free or cached) is a ValueError."""
    free = cache.allocate(1)
    cache.release(free)
    cached = cache.match(PROMPT).block_ids[0]
    cache.release([cached])
    assert_rejected(cache, ValueError, lambda: cache.copy_on_write(free[0]))
    assert_rejected(cache, ValueError, lambda: cache.copy_on_write(cached))


def test_unpin_without_pin(cache: PrefixCache) -> None:
    """unpin() needs a pinned prefix of the tokens in their namespace."""
    assert_rejected(cache, ValueError, lambda: cache.unpin(PROMPT))
    assert_rejected(cache, ValueError, lambda: cache.unpin(OTHER))
    assert_rejected(cache, ValueError, lambda: cache.unpin(OTHER[:4], salt="s"))
    cache.unpin([*OTHER, 1], salt="s")
    assert_rejected(cache, ValueError, lambda: cache.unpin(OTHER, salt="s"))


@pytest.mark.parametrize("count", [3, 12])  # checked one by one, and by numpy passes
@pytest.mark.parametrize("flaw", ["twice", "unheld", "cached"])
def test_insert_checks_every_new_block(count: int, flaw: str) -> None:
    """A duplicate, unheld or already cached (and held) block among few or many new blocks is
    a ValueError naming the problem, with nothing changed."""
    cache = PrefixCache(num_blocks=32, block_size=BS)
    cache_prompt(cache, PROMPT)
    cached = cache.match(PROMPT).block_ids[0]
    ids = cache.allocate(count)
    if flaw == "twice":
        ids[-1] = ids[0]
    elif flaw == "unheld":
        cache.release([ids[-1]])
    else:
        ids[-1] = cached
    message = {"twice": "twice", "unheld": "not in use", "cached": "already caches"}[flaw]
    before = state(cache)
    with pytest.raises(ValueError, match=message):
        cache.insert(list(range(100, 100 + count * BS)), ids)
    assert state(cache) == before
    cache.check_invariants()
