"""Hash collisions may cost a miss, never a wrong block.

A weak ``block_hasher`` (constant, or ``seed % 3``) makes every block hash collide; the
cache must still only ever match blocks whose stored tokens equal the query's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import xxhash
from cache_reference_model import cache_prompt
from hypothesis import HealthCheck, settings
from test_cache_stateful import CacheMachine

from prefixcache import PrefixCache

BS = 2


def constant_hasher(data: object, seed: int) -> int:
    """Every block collides with every other block."""
    return 0


def seed_mod_3_hasher(data: object, seed: int) -> int:
    """Ignores the tokens: blocks at the same depth collide."""
    return seed % 3


def xxh3_mod_3_hasher(data: object, seed: int) -> int:
    """Looks at the tokens but has only three values."""
    return xxhash.xxh3_64_intdigest(bytes(memoryview(data)), seed=seed) % 3  # type: ignore[arg-type]


WEAK_HASHERS = [constant_hasher, seed_mod_3_hasher, xxh3_mod_3_hasher]

PROMPTS = [list(p) for p in itertools.product([0, 1], repeat=3 * BS)]


@pytest.mark.parametrize("hasher", WEAK_HASHERS, ids=lambda h: h.__name__)
def test_matches_hold_only_the_querys_tokens(hasher: Callable[[object, int], int]) -> None:
    """After caching many colliding prompts, every match returns only blocks of that prompt."""
    cache = PrefixCache(256, block_size=BS, block_hasher=hasher)
    owner: dict[int, tuple[int, ...]] = {}
    for tokens in PROMPTS:
        for i, block in enumerate(cache_prompt(cache, tokens)):
            assert owner.setdefault(block, tuple(tokens[: (i + 1) * BS])) == tuple(
                tokens[: (i + 1) * BS]
            ), "a cached block changed its prefix"
        cache.check_invariants()
    hits = cache.stats()["hit_tokens"]
    for tokens in PROMPTS:
        m = cache.match(tokens)
        assert m.num_tokens == len(m.block_ids) * BS
        for i, block in enumerate(m.block_ids):
            assert owner.get(block) == tuple(tokens[: (i + 1) * BS]), "wrong block matched"
        hits += m.num_tokens
        cache.release(list(m.block_ids))
    assert cache.stats()["hit_tokens"] == hits
    cache.check_invariants()


@pytest.mark.parametrize("hasher", WEAK_HASHERS, ids=lambda h: h.__name__)
def test_colliding_prompt_is_a_miss_not_a_hit(hasher: Callable[[object, int], int]) -> None:
    """Two prompts with equal hashes but different tokens never share a block."""
    cache = PrefixCache(16, block_size=BS, block_hasher=hasher)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    assert cache.block_hashes(a) == cache.block_hashes(b) or hasher is xxh3_mod_3_hasher
    cache_prompt(cache, a)
    assert cache.lookup(b) == 0
    m = cache.match(b)
    assert m.block_ids == [] and m.num_tokens == 0
    assert cache.lookup(a) == 4


def test_collision_across_salts_stays_isolated() -> None:
    """With a constant hasher, salts still never share blocks."""
    cache = PrefixCache(16, block_size=BS, block_hasher=constant_hasher)
    cache_prompt(cache, [1, 2, 3, 4], salt="x")
    assert cache.lookup([1, 2, 3, 4]) == 0
    assert cache.lookup([1, 2, 3, 4], salt="y") == 0
    assert cache.lookup([1, 2, 3, 4], salt="x") == 4


def test_collisions_only_cost_fewer_new_blocks() -> None:
    """An insert under collisions caches at most the uncached blocks, never duplicates."""
    cache = PrefixCache(32, block_size=BS, block_hasher=constant_hasher)
    cache_prompt(cache, [1, 1, 2, 2])
    ids = cache.allocate(2)
    newly = cache.insert([3, 3, 4, 4], ids)
    assert 0 <= newly <= 2
    assert cache.lookup([3, 3, 4, 4]) <= 2 * newly
    assert cache.lookup([1, 1, 2, 2]) == 4
    cache.release(ids)
    cache.check_invariants()
    stats = cache.stats()
    assert stats["cached"] == 2 + newly and stats["in_use"] == 0


class ConstantHashMachine(CacheMachine):
    """The stateful comparison with every block hash equal (reference allows misses)."""

    block_hasher = staticmethod(constant_hasher)
    exact = False


class Mod3HashMachine(CacheMachine):
    """The stateful comparison with a three-valued hash of the tokens."""

    block_hasher = staticmethod(xxh3_mod_3_hasher)
    exact = False


WEAK_SETTINGS = settings(
    max_examples=20,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
ConstantHashMachine.TestCase.settings = WEAK_SETTINGS
Mod3HashMachine.TestCase.settings = WEAK_SETTINGS
TestConstantHashStateful = ConstantHashMachine.TestCase
TestMod3HashStateful = Mod3HashMachine.TestCase
