"""TTL pins: a pinned prefix survives eviction until its time passes (a fake clock moves, no
sleeping), pinning again extends it, and a tenant cannot pin past its budget."""

from __future__ import annotations

import numpy as np
import pytest

from prefixcache import CacheFull, PrefixCache
from prefixcache.ttl_pins import PinBudgetExceeded, TtlPins

BS = 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cached(cache: PrefixCache, tokens: list[int], salt: str | None = None) -> None:
    """Cache ``tokens`` as a request would: allocate, insert, release."""
    blocks = cache.allocate(len(tokens) // BS)
    cache.insert(np.asarray(tokens, dtype=np.int32), blocks, salt)
    cache.release(blocks)


def fill_pool(cache: PrefixCache) -> None:
    """Allocate every block the pool can give (evicting whatever is evictable), then free."""
    blocks = []
    while True:
        try:
            blocks += cache.allocate(1)
        except CacheFull:
            break
    cache.release(blocks)


def test_a_pinned_prefix_survives_eviction_until_it_expires() -> None:
    cache, clock = PrefixCache(16, BS), Clock()
    pins = TtlPins(cache, budget_blocks=8, clock=clock)
    doc = list(range(1, 17))
    cached(cache, doc)
    assert pins.pin(doc, None, ttl=300) == 16
    fill_pool(cache)
    assert cache.lookup(doc) == 16  # pinned: not evicted
    clock.now += 299
    assert pins.expire() == 0
    pins.pin(doc, None, ttl=600)  # extended: 600 s from now
    clock.now += 301
    assert pins.expire() == 0 and cache.lookup(doc) == 16
    clock.now += 300
    assert pins.expire() == 1 and len(pins) == 0
    fill_pool(cache)
    assert cache.lookup(doc) == 0  # let go: evicted
    pins.check_invariants()


def test_nested_pins_expire_apart_and_direct_pins_stay() -> None:
    cache, clock = PrefixCache(16, BS), Clock()
    pins = TtlPins(cache, budget_blocks=8, clock=clock)
    system, conversation = list(range(1, 9)), list(range(1, 17))
    cached(cache, conversation)
    pins.pin(system, None, ttl=3600)
    pins.pin(conversation, None, ttl=300)
    cache.pin(conversation)  # a pin made directly, not through the TTL pins
    assert pins.blocks_of(None) == 6
    clock.now += 400
    assert pins.expire() == 1
    fill_pool(cache)
    assert cache.lookup(conversation) == 16  # still held by the direct pin
    cache.unpin(conversation)
    fill_pool(cache)
    assert cache.lookup(conversation) == 8  # the system prompt's 1 h pin holds its part
    clock.now += 3600
    pins.expire()
    pins.check_invariants()
    assert cache.num_pinned_nodes == 0


def test_each_salt_has_its_budget() -> None:
    cache, clock = PrefixCache(32, BS), Clock()
    pins = TtlPins(cache, budget_blocks=3, clock=clock)
    a, b = list(range(1, 13)), list(range(50, 62))
    cached(cache, a, "tenant-a")
    cached(cache, b, "tenant-b")
    assert pins.pin(a, "tenant-a", ttl=60) == 12
    with pytest.raises(PinBudgetExceeded, match="budget is 3"):
        pins.pin(a + [99] * 4, "tenant-a", ttl=60)  # another prefix: 4 more blocks
    assert pins.pin(a, "tenant-a", ttl=120) == 12  # the same one: extended, always fits
    assert pins.pin(b, "tenant-b", ttl=60) == 12  # another tenant's budget
    assert pins.pin([7] * 8, "tenant-c", ttl=60) == 0  # nothing cached: nothing pinned
    clock.now += 200
    assert pins.expire() == 2 and pins.blocks_of("tenant-a") == 0
    pins.check_invariants()
    with pytest.raises(ValueError):
        pins.pin(a, "tenant-a", ttl=0)
