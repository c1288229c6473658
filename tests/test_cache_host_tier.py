"""The host-memory tier under the pool: evicted full blocks are written back, found again by
their tokens and loaded into fresh pool blocks; the copies the cache hands out, carried out in
order, always leave every cached block (pool and tier) holding its own tokens' KV.

A model of the bytes stands in for the KV: each pool block and tier slot holds the tokens whose
KV it carries. Admissions run as the scheduler runs them (promote, match, allocate, then the
copies, then the step writes the new blocks); after each, every block the tree caches and every
slot the tier indexes must hold exactly its tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache import PrefixCache
from prefixcache.errors import CacheFull
from prefixcache.host_tier import HostTierIndex

BS = 4
BASES = [[(7 * b + i) % 50 + 1 for i in range(40)] for b in range(6)]  # 6 prompts' tokens


class DictLowerTier:
    """A lower tier in a dict: what a disk tier keeps, keyed and checked the same way; its
    payloads are the tokens whose KV they carry (pickled as a tuple)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.records: dict[tuple, tuple[int, tuple[int, ...], tuple[int, ...]]] = {}

    def holds(self, name, block_hash: int) -> bool:
        return (name, block_hash) in self.records

    def keep(self, name, block_hash: int, parent: int, tokens, content) -> None:
        if len(self.records) >= self.capacity:
            self.records.pop(next(iter(self.records)))  # oldest first
        self.records[(name, block_hash)] = (parent, tuple(tokens), content)

    def find(self, name, parent_hash, hashes, tokens):
        found, previous = [], parent_hash
        for block_hash, row in zip(hashes, tokens, strict=True):
            record = self.records.get((name, block_hash))
            if record is None or record[0] != previous or record[1] != tuple(row):
                break
            found.append((name, block_hash))
            previous = block_hash
        return found

    def fetch(self, name, handles):
        return [self.records[h][2] for h in handles if h in self.records]


class BytesModel:
    """What each pool block and tier slot really holds (the tokens of the KV written there)."""

    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache
        self.pool: dict[int, tuple[int, ...]] = {}
        self.host: dict[int, tuple[int, ...]] = {}

    def carry_out_copies(self) -> None:
        """What the engine does between the schedule and the step, in its order."""
        writebacks, loads = self.cache.take_tier_copies()
        for block, slot in writebacks:
            self.host[slot] = self.pool[block]
        for block, slot in loads:
            self.pool[block] = self.host[slot]
        for block, content in self.cache.take_disk_loads():
            self.pool[block] = content

    def persist(self) -> None:
        """What the engine does after a step: the newly cached blocks' bytes, to the lower
        tier (each must hold its own tokens by then)."""
        lower = self.cache.lower_tier
        for entry in self.cache.take_persist():
            assert self.pool[entry.block] == entry.tokens, entry
            assert isinstance(lower, DictLowerTier)
            lower.keep(entry.name, entry.block_hash, entry.parent_hash, entry.tokens,
                       self.pool[entry.block])  # fmt: skip

    def admit(self, tokens: list[int], salt: str | None = None) -> int:
        """One request's admission and prefill; returns how many tokens it found cached."""
        cache = self.cache
        cache.promote(tokens, salt, max_tokens=len(tokens) - 1)
        match = cache.match(tokens, salt, max_tokens=len(tokens) - 1)
        need = -(-len(tokens) // BS) - len(match.block_ids)
        try:
            fresh = cache.allocate(need)
        except CacheFull:
            cache.release(match.block_ids)
            self.carry_out_copies()
            return 0
        self.carry_out_copies()
        ids = match.block_ids + fresh
        for i, block in enumerate(match.block_ids):  # what the step reads: its own KV
            assert self.pool[block] == tuple(tokens[i * BS : (i + 1) * BS]), (i, block)
        for i in range(len(match.block_ids), len(ids)):  # what the step writes
            self.pool[ids[i]] = tuple(tokens[i * BS : (i + 1) * BS])
        cache.insert(tokens, ids, salt)
        cache.release(ids)
        if cache.lower_tier is not None:
            self.persist()
        return match.num_tokens

    def check(self) -> None:
        cache = self.cache
        cache.check_invariants()
        tree = cache.tree
        for block in np.flatnonzero(tree.node_of >= 0).tolist():
            if not tree.is_partial(block):
                assert self.pool[block] == tuple(tree.tokens[block].tolist()), block
        tier = cache.host_tier
        if tier is not None:
            for slot in tier.slot_of.values():
                assert self.host[slot] == tuple(tier.tokens[slot].tolist()), slot
        lower = cache.lower_tier
        if isinstance(lower, DictLowerTier):
            for _parent, tokens, content in lower.records.values():
                assert content == tokens


def test_an_evicted_prefix_comes_back_from_the_tier() -> None:
    cache = PrefixCache(12, BS, host_tier_blocks=40)
    model = BytesModel(cache)
    assert model.admit(BASES[0]) == 0
    model.admit(BASES[1])  # the pool holds 12 blocks: BASES[0]'s go to the tier
    model.admit(BASES[2])
    model.check()
    assert cache.lookup(BASES[0]) < 36
    assert model.admit(BASES[0]) == 36  # every full block but the last token's
    model.check()
    stats = cache.stats()
    assert stats["host_tier_hit_tokens"] >= 36 - cache.lookup(BASES[0][:4]) and stats[
        "host_tier_blocks"
    ] > 0


def test_another_salt_never_reads_the_tier_s_blocks() -> None:
    cache = PrefixCache(12, BS, host_tier_blocks=40)
    model = BytesModel(cache)
    model.admit(BASES[0], salt="a")
    model.admit(BASES[1], salt="a")
    model.admit(BASES[2], salt="a")
    assert model.admit(BASES[0], salt="b") == 0
    assert cache.stats()["host_tier_hit_tokens"] == 0
    model.check()


def test_a_block_whose_tokens_differ_under_the_same_hash_is_a_miss() -> None:
    tier = HostTierIndex(4, BS)
    tokens = np.arange(8, dtype=np.int32).reshape(2, BS)
    assert tier.offer("ns", 5, [11, 12], tokens) == [0, 1]
    assert tier.find("ns", 5, [11, 12], tokens) == [0, 1]
    forged = tokens.copy()
    forged[1, 0] = 99
    assert tier.find("ns", 5, [11, 12], forged) == [0]  # same hashes, other tokens
    assert tier.find("ns", 6, [11, 12], tokens) == []  # another parent
    assert tier.find("other", 5, [11, 12], tokens) == []
    tier.check_invariants()


def test_slots_being_loaded_are_not_reused_until_handed_out() -> None:
    tier = HostTierIndex(2, BS)
    tokens = np.arange(8, dtype=np.int32).reshape(2, BS)
    tier.offer("ns", 0, [1, 2], tokens)
    tier.hold_for_load([0, 1])
    assert tier.offer("ns", 0, [3], tokens[:1]) == [-1]  # no slot it may take: dropped
    tier.take_loads()
    assert tier.offer("ns", 0, [3], tokens[:1]) == [0]  # now the oldest goes
    assert tier.clear() == 2
    tier.check_invariants()


@pytest.mark.parametrize("pool, slots", [(10, 6), (16, 40), (12, 3)])
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 5), st.integers(6, 40), st.booleans()),
                    min_size=1, max_size=40))  # fmt: skip
def test_random_traffic_keeps_every_cached_block_true(pool, slots, ops) -> None:
    cache = PrefixCache(pool, BS, host_tier_blocks=slots)
    model = BytesModel(cache)
    for base, length, salted in ops:
        tokens = BASES[base][:length]
        model.admit(tokens, "s" if salted else None)
        model.check()
        if length == 40 and base == 5:
            cache.reset(host_tier=salted)  # sometimes the tier is emptied too
            model.check()
    assert cache.stats()["in_use"] == 0


@pytest.mark.parametrize("pool, slots, records", [(10, 6, 40), (12, 0, 30), (16, 3, 8)])
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 5), st.integers(6, 40), st.booleans()),
                    min_size=1, max_size=40))  # fmt: skip
def test_random_traffic_over_pool_host_and_lower_tier(pool, slots, records, ops) -> None:
    cache = PrefixCache(pool, BS, host_tier_blocks=slots)
    cache.set_lower_tier(DictLowerTier(records))
    model = BytesModel(cache)
    for base, length, salted in ops:
        model.admit(BASES[base][:length], "s" if salted else None)
        model.check()
    assert cache.stats()["in_use"] == 0


def test_a_prefix_only_the_lower_tier_holds_comes_back() -> None:
    cache = PrefixCache(12, BS)
    cache.set_lower_tier(DictLowerTier(100))
    model = BytesModel(cache)
    model.admit(BASES[0])
    model.admit(BASES[1])
    model.admit(BASES[2])
    assert cache.lookup(BASES[0]) == 0
    assert model.admit(BASES[0]) == 36
    assert cache.stats()["lower_tier_hit_tokens"] == 36
    model.check()
