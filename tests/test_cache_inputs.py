"""Every user-caused error of PrefixCache: the exact exception type, and no state change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from cache_reference_model import cache_prompt, internal_state, snapshot

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
    return (
        internal_state(cache),
        snapshot(cache, [(PROMPT, None), (OTHER, "s"), (OTHER, None)]),
        cache.drain_events(),
    )


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


BAD_PRIORITIES: list[tuple[object, type[Exception]]] = [
    (1.5, TypeError),
    (True, TypeError),
    (np.int64(1), TypeError),
    ("1", TypeError),
    (None, TypeError),
    (2**15, ValueError),
    (-(2**15) - 1, ValueError),
]


@pytest.mark.parametrize(("priority", "error"), BAD_PRIORITIES, ids=repr)
def test_insert_partial_checks_priority_as_insert_does(
    cache: PrefixCache, priority: object, error: type[Exception]
) -> None:
    """insert_partial refuses every priority insert refuses, before anything changes (a
    float priority used to be stored and broke the next release)."""
    tokens = [*PROMPT, 1, 2]
    ids = cache.allocate(4)
    cache.insert(tokens, ids)
    assert_rejected(cache, error, lambda: cache.insert(tokens, ids, priority=priority))  # type: ignore[arg-type]
    assert_rejected(
        cache,
        error,
        lambda: cache.insert_partial(tokens, ids[3], priority=priority),  # type: ignore[arg-type]
    )
    # also where nothing would be cached (no partial block): still checked first
    assert_rejected(cache, error, lambda: cache.insert_partial(PROMPT, ids[3], priority=priority))  # type: ignore[arg-type]
    assert cache.insert_partial(tokens, ids[3], priority=2**15 - 1)
    cache.release(ids)
    cache.check_invariants()


@pytest.mark.parametrize(
    ("max_tokens", "error"),
    [
        (6.0, TypeError),
        (True, TypeError),
        (False, TypeError),
        ("8", TypeError),
        ([4], TypeError),
        (-1, ValueError),
        (np.int64(-3), ValueError),
    ],
    ids=repr,
)
@pytest.mark.parametrize("partial_block", [False, True])
def test_match_checks_max_tokens_first(
    cache: PrefixCache, max_tokens: object, error: type[Exception], partial_block: bool
) -> None:
    """max_tokens is None or an int >= 0; anything else raises before the counters move."""
    assert_rejected(
        cache,
        error,
        lambda: cache.match(PROMPT, max_tokens=max_tokens, partial_block=partial_block),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("max_tokens", [np.int64(8), np.int32(8), np.uint8(8), 8])
def test_match_takes_numpy_max_tokens_as_a_python_int(
    cache: PrefixCache, max_tokens: object
) -> None:
    """A numpy integer cap works like the int, and no numpy int reaches the result or stats."""
    m = cache.match(PROMPT, max_tokens=max_tokens)  # type: ignore[arg-type]
    assert m.num_tokens == 8 and type(m.num_tokens) is int
    assert type(cache.stats()["hit_tokens"]) is int
    cache.release(m.block_ids)
    cache.check_invariants()


BAD_BLOCK_ID_LISTS: list[tuple[object, type[Exception]]] = [
    ([0, True], TypeError),
    ([True], TypeError),
    ([2, False], TypeError),
    ([0, np.True_], TypeError),
    ([0, 1.0], TypeError),
    ({1}, TypeError),
    ({1: 1}, TypeError),
    (np.zeros((0, 2), dtype=np.int32), TypeError),
    (np.zeros((1, 2), dtype=np.int32), TypeError),
    (np.array([0, 1], dtype=bool), TypeError),
    (np.array([0.0]), TypeError),
    ("01", TypeError),
    (b"\x00", TypeError),
    (memoryview(b"\x00"), TypeError),
    (None, TypeError),
    (3, TypeError),
    ([2**70], ValueError),
    ([-(2**70)], ValueError),
    ([2**63], ValueError),
    ([2**31], ValueError),
    ([np.uint64(2**63)], ValueError),
    ([0, 16], ValueError),
    (np.array([0, 2**40]), ValueError),
]


@pytest.mark.parametrize(("ids", "error"), BAD_BLOCK_ID_LISTS, ids=repr)
@pytest.mark.parametrize("method", ["release", "fork", "insert"])
def test_block_id_lists_are_checked_alike(
    cache: PrefixCache, ids: object, error: type[Exception], method: str
) -> None:
    """Bools among ints, floats, sets, 2-D or empty 2-D arrays and byte strings are
    TypeErrors; an int outside the pool, however large, is a ValueError naming it."""
    held = cache.allocate(2)
    cache.fork(held)
    call = {
        "release": lambda: cache.release(ids),  # type: ignore[arg-type]
        "fork": lambda: cache.fork(ids),  # type: ignore[arg-type]
        "insert": lambda: cache.insert(list(range(100, 102)), ids),  # type: ignore[arg-type]
    }[method]
    before = state(cache)
    with pytest.raises(error, match="unknown block id" if error is ValueError else "block_ids"):
        call()
    assert state(cache) == before
    cache.check_invariants()


@pytest.mark.parametrize(
    "form",
    [
        list,
        tuple,
        lambda ids: np.array(ids, dtype=np.int32),
        lambda ids: np.array(ids),
        lambda ids: [np.int64(b) for b in ids],
        lambda ids: np.array(ids, dtype=np.uint16),
    ],
)
def test_block_id_forms_that_are_accepted(form: Callable[[list[int]], object]) -> None:
    """Lists and tuples of ints or numpy ints and 1-D integer arrays are block ids."""
    cache = PrefixCache(8, block_size=2)
    ids = cache.allocate(2)
    cache.fork(form(ids))  # type: ignore[arg-type]
    assert cache.insert([1, 2, 3, 4], form(ids)) == 2  # type: ignore[arg-type]
    cache.release(form(ids))  # type: ignore[arg-type]
    cache.release(form(ids))  # type: ignore[arg-type]
    assert cache.stats()["in_use"] == 0 and cache.lookup([1, 2, 3, 4]) == 4
    cache.release(form([]))  # type: ignore[arg-type]
    cache.check_invariants()


@pytest.mark.parametrize("tokens", [memoryview(b"ab"), bytearray(b"ab")], ids=repr)
@pytest.mark.parametrize("method", sorted(TOKEN_METHODS))
def test_byte_buffers_are_not_token_lists(cache: PrefixCache, method: str, tokens: object) -> None:
    """A memoryview or bytearray is refused like bytes, not read as byte-valued token ids."""
    assert_rejected(cache, TypeError, lambda: TOKEN_METHODS[method](cache, tokens, None))


@pytest.mark.parametrize("max_tokens", [6.0, 6.5, "6"], ids=repr)
def test_a_non_int_max_tokens_fails_before_the_counters_move(max_tokens: object) -> None:
    """Where the walk itself would not trip over a float cap (one block per node), the
    partial-block search used to, after query_tokens had grown."""
    cache = PrefixCache(8, block_size=4)
    first = cache.allocate(1)
    cache.insert([1, 2, 3, 4], first, priority=1)  # a priority of its own: a node of its own
    second = cache.allocate(1)
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], first + second)
    cache.release(first + second)
    before = internal_state(cache)
    with pytest.raises(TypeError, match="max_tokens"):
        cache.match([1, 2, 3, 4, 5, 6, 7, 8], max_tokens=max_tokens, partial_block=True)  # type: ignore[arg-type]
    assert internal_state(cache) == before
    cache.check_invariants()
