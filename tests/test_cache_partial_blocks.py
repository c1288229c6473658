"""Partial blocks: the end of a finished request cached by insert_partial, found again by
match(partial_block=True), immutable, evictable, and invisible to full-block matching and to
the block-hash events."""

from __future__ import annotations

from collections import Counter

import pytest
from cache_reference_model import cache_prompt
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from prefixcache import BlockRemoved, BlockStored, CopyOp, PrefixCache

BS = 4
FULL = [1, 2, 3, 4, 5, 6, 7, 8]  # two full blocks
TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=11)  # few symbols: much sharing


def finished_request(cache: PrefixCache, tokens: list[int]) -> int:
    """A request over ``tokens`` that caches its full blocks and its partial last block, then
    finishes; returns the partial block's id."""
    m = cache.match(tokens)
    need = -(-len(tokens) // BS) - len(m.block_ids)
    blocks = m.block_ids + cache.allocate(need)
    cache.insert(tokens, blocks)
    assert cache.insert_partial(tokens, blocks[-1])
    cache.release(blocks)
    return blocks[-1]


def test_a_finished_requests_last_tokens_are_found_again() -> None:
    cache = PrefixCache(8, block_size=BS)
    tail = finished_request(cache, [*FULL, 9, 10, 11])
    assert cache.stats()["in_use"] == 0 and cache.stats()["cached"] == 3
    cache.check_invariants()
    m = cache.match([*FULL, 9, 10, 11, 12, 13], partial_block=True)
    assert (m.num_tokens, m.partial_block, m.partial_tokens) == (8, tail, 3)
    cache.release([*m.block_ids, tail])
    m = cache.match([*FULL, 9, 10, 99], partial_block=True)  # shares 2 of its 3 tokens
    assert (m.partial_block, m.partial_tokens) == (tail, 2)
    cache.release([*m.block_ids, tail])
    cache.check_invariants()


def test_full_block_matching_never_sees_a_partial_block() -> None:
    """match without partial_block, lookup and a later full insert ignore it."""
    cache = PrefixCache(8, block_size=BS)
    tail = finished_request(cache, [*FULL, 9, 10, 11])
    assert cache.lookup([*FULL, 9, 10, 11, 12]) == 8
    assert cache.match([*FULL, 9, 10, 11, 12]).partial_block is None
    cache.release(cache.match(FULL).block_ids)
    # the same tokens as a full block are cached beside it, in a block of their own
    blocks = cache_prompt(cache, [*FULL, 9, 10, 11, 12])
    assert len(blocks) == 3 and tail not in blocks
    assert cache.lookup([*FULL, 9, 10, 11, 12]) == 12
    cache.check_invariants()


@pytest.mark.parametrize(
    ("cached", "tail_tokens"),
    [
        ([*FULL, 9, 10, 11, 12], [9, 10]),  # a full block after the path holds them
        ([*FULL, 9, 10, 11], [9, 10]),  # a longer partial block holds them
        ([*FULL, 9, 10], [9, 10]),  # the same partial block is cached already
    ],
)
def test_a_covered_partial_block_is_not_cached_twice(
    cached: list[int], tail_tokens: list[int]
) -> None:
    cache = PrefixCache(8, block_size=BS)
    if len(cached) % BS:
        finished_request(cache, cached)
    else:
        cache_prompt(cache, cached)
    stored = cache.stats()["cached_blocks_total"]
    m = cache.match(FULL)
    (block,) = cache.allocate(1)
    assert not cache.insert_partial([*FULL, *tail_tokens], block)
    cache.release([*m.block_ids, block])
    assert cache.stats()["cached_blocks_total"] == stored
    cache.check_invariants()


def test_nothing_cached_without_its_full_blocks_or_a_partial_block() -> None:
    cache = PrefixCache(8, block_size=BS)
    (block,) = cache.allocate(1)
    assert not cache.insert_partial([*FULL, 9], block)  # the full blocks are not cached
    assert not cache.insert_partial(FULL[:4], block)  # no partial block
    assert cache.insert_partial([9, 10, 11], block)  # no full block before it: at the root
    assert not cache.insert_partial([9, 10, 11], block)  # again (forks share a block): a no-op
    assert not cache.insert_partial([9, 10], block)  # covered by it
    cache.release([block])
    cache_prompt(cache, FULL)
    held = cache.match(FULL).block_ids
    with pytest.raises(ValueError, match="already caches"):  # a full block elsewhere
        cache.insert_partial([20, 21], held[0])
    cache.release(held)
    (unheld,) = cache.allocate(1)
    cache.release([unheld])
    with pytest.raises(ValueError, match="not in use"):
        cache.insert_partial([5, 6], unheld)
    m = cache.match([9, 10, 11, 12], partial_block=True)
    assert (m.partial_block, m.partial_tokens) == (block, 3)
    cache.release([block])
    cache.check_invariants()


def test_a_partial_block_inside_a_cached_run_splits_it() -> None:
    """The full blocks end inside a longer cached run: the run is split there and the
    partial block hangs beside its rest."""
    cache = PrefixCache(8, block_size=BS)
    cache_prompt(cache, [*FULL, 9, 10, 11, 12])
    tail = finished_request(cache, [*FULL, 20, 21])
    nodes = cache.stats()["nodes"]
    assert nodes == 4  # root, the two full blocks, the third full block, the partial block
    m = cache.match([*FULL, 20, 21, 22], partial_block=True)
    assert (m.partial_block, m.partial_tokens) == (tail, 2)
    cache.release([*m.block_ids, tail])
    cache.check_invariants()


def test_a_cached_partial_block_is_copied_before_a_write() -> None:
    """The request that still holds it must not write into it any more."""
    cache = PrefixCache(8, block_size=BS)
    m = cache.match(FULL)
    blocks = m.block_ids + cache.allocate(3)
    cache.insert(FULL, blocks)
    assert cache.insert_partial([*FULL, 9], blocks[2])
    new, op = cache.copy_on_write(blocks[2])
    assert op == CopyOp(blocks[2], new) and new != blocks[2]
    cache.release([*blocks[:2], new])
    cache.check_invariants()


def test_partial_blocks_are_evicted_and_make_no_events() -> None:
    cache = PrefixCache(3, block_size=BS, enable_events=True)
    tail = finished_request(cache, [*FULL, 9])
    events = cache.drain_events()
    assert [type(e) for e in events] == [BlockStored]  # the two full blocks only
    assert len(events[0].block_hashes) == 2
    assert cache.allocate(1) == [tail]  # the least recently used leaf goes first
    assert not [e for e in cache.drain_events() if isinstance(e, BlockRemoved)]
    cache.release([tail])
    assert cache.lookup(FULL) == 8
    cache.check_invariants()


def hit_partial(cache: PrefixCache, tokens: list[int], expected_shared: int) -> None:
    """One request whose match ends in a partial-block hit, released at once."""
    m = cache.match(tokens, partial_block=True)
    assert m.partial_tokens == expected_shared
    cache.release([*m.block_ids, m.partial_block])
    cache.check_invariants()


def test_a_partial_hit_refreshes_the_cached_partial_block() -> None:
    """A partial block that requests keep hitting outlives one nobody hit since (it used to
    keep its insert-time recency, so the hottest partial block was evicted first)."""
    cache = PrefixCache(3, block_size=BS)
    finished_request(cache, [1, 2, 3, 4, 5, 6])  # P1: block [1..4], partial [5, 6]
    cache.release(cache.match([1, 2, 3, 4]).block_ids)
    finished_request(cache, [1, 2, 3, 4, 7, 8])  # P2: partial [7, 8], newer than P1
    for _ in range(3):
        hit_partial(cache, [1, 2, 3, 4, 5, 6, 9], 2)  # P1 is now the more recent
    cache.allocate(1)
    assert cache.lookup([1, 2, 3, 4, 5, 6], partial_block=True) == 6
    assert cache.lookup([1, 2, 3, 4, 7, 8], partial_block=True) == 4
    cache.check_invariants()


def test_a_partial_hit_on_a_full_block_refreshes_that_block_only() -> None:
    """A partial hit on the next full block of a cached run counts as an access to that
    block, as a full-block hit would, and to none after it."""
    cache = PrefixCache(5, block_size=BS)
    cache_prompt(cache, [*FULL, 9, 10, 11, 12])  # one run of three blocks: A B C
    cache_prompt(cache, [7, 7, 7, 7])  # newer than the run
    hit_partial(cache, [1, 2, 3, 4, 5, 6, 0], 2)  # A in full, then two tokens of B
    cache.allocate(2)  # one free block, then C (the run's unrefreshed tail) is evicted
    assert cache.lookup([*FULL, 9, 10, 11, 12]) == 8
    cache.allocate(1)  # B (hit after [7, 7, 7, 7] was cached) outlives it
    assert cache.lookup([7, 7, 7, 7]) == 0
    assert cache.lookup(FULL) == 8
    cache.check_invariants()


def test_a_partial_hit_on_a_runs_first_block_refreshes_that_block_only() -> None:
    """The same with no full block matched: the hit block is the first of a child run."""
    cache = PrefixCache(4, block_size=BS)
    cache_prompt(cache, FULL)  # one run of two blocks: A B
    cache_prompt(cache, [7, 7, 7, 7])  # newer than the run
    hit_partial(cache, [1, 2, 0], 2)  # two tokens of A
    cache.allocate(2)  # one free block, then B (the run's unrefreshed tail)
    assert cache.lookup(FULL) == 4
    cache.allocate(1)  # A (hit after [7, 7, 7, 7] was cached) outlives it
    assert cache.lookup([7, 7, 7, 7]) == 0
    assert cache.lookup(FULL) == 4
    cache.check_invariants()


def test_pin_keeps_the_partial_block_with_its_path() -> None:
    """pin covers the prefix to its last cached token; unpin releases that pin first."""
    cache = PrefixCache(8, block_size=BS)
    finished_request(cache, [*FULL, 9, 10, 11])
    assert cache.pin([*FULL, 9, 10, 11]) == 11
    cache.reset()
    assert cache.lookup([*FULL, 9, 10, 11], partial_block=True) == 11
    assert cache.lookup([*FULL, 9, 10, 11]) == 8
    cache.unpin([*FULL, 9, 10, 11])
    with pytest.raises(ValueError):
        cache.unpin([*FULL, 9, 10, 11])
    assert cache.reset() == 3
    assert cache.lookup([*FULL, 9, 10, 11], partial_block=True) == 0
    cache.check_invariants()
    # a prompt that stops inside the partial block pins it too; one that goes on differently
    # pins only its full blocks
    finished_request(cache, [*FULL, 9, 10, 11])
    assert cache.pin([*FULL, 9, 10]) == 10
    assert cache.pin([*FULL, 9, 12]) == 8
    cache.unpin([*FULL, 9, 10])
    cache.unpin([*FULL, 9, 12])
    assert cache.stats()["pinned_nodes"] == 0
    cache.check_invariants()


def cached_blocks(cache: PrefixCache) -> dict[tuple[int, ...], list[tuple[int, ...]]]:
    """Every cached block of the default namespace by the tokens before it: the tokens it
    holds (fewer than a block for a partial one), found by walking the whole tree."""
    tree = cache.tree
    found: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    stack = [(tree.roots.get((None, ())), ())]
    while stack:
        node, before = stack.pop()
        if node is None:
            continue
        for block in node.block_ids:
            held = tuple(tree.block_tokens(int(block)).tolist())
            found.setdefault(before, []).append(held)
            before += held
        stack += [(child, before) for child in (node.children or {}).values()]
    return found


def best_match(cache: PrefixCache, tokens: list[int], limit: int) -> tuple[int, int]:
    """What a match over ``tokens[:limit]`` must find, from the tree's contents alone: the
    longest run of cached full blocks, then the most next tokens any cached block after that
    run shares with the query (less than a block): (full-block tokens, shared tokens)."""
    bs = cache.block_size
    after = cached_blocks(cache)
    start = 0
    while start + bs <= limit and tuple(tokens[start : start + bs]) in after.get(
        tuple(tokens[:start]), []
    ):
        start += bs
    want = tokens[start : start + min(limit - start, bs - 1)]

    def shared(held: tuple[int, ...]) -> int:
        count = 0
        while count < min(len(held), len(want)) and held[count] == want[count]:
            count += 1
        return count

    candidates = after.get(tuple(tokens[:start]), [])
    return start, max((shared(held) for held in candidates), default=0)


class PartialBlockMachine(RuleBasedStateMachine):
    """Random requests that cache their partial last blocks, matches that hand them out,
    evictions, pins and resets: the invariants hold after every step, every hit (full blocks
    and the partial block) holds exactly the query's tokens, and no longer hit was cached
    (checked against a walk of the whole tree)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = PrefixCache(12, block_size=3)
        self.held: list[list[int]] = []
        self.pinned: list[list[int]] = []

    @rule(tokens=TOKENS)
    def finished_request(self, tokens: list[int]) -> None:
        cache = self.cache
        m = cache.match(tokens, partial_block=True)
        need = -(-len(tokens) // 3) - len(m.block_ids)
        if not cache.can_allocate(need):
            cache.release(m.block_ids if m.partial_block is None else [*m.block_ids,
                                                                       m.partial_block])
            return
        blocks = m.block_ids + cache.allocate(need)
        if m.partial_block is not None:
            cache.release([m.partial_block])  # "copied" into blocks[len(m.block_ids)]
        cache.insert(tokens, blocks)
        if len(tokens) % 3:
            cache.insert_partial(tokens, blocks[-1])
        cache.release(blocks)

    @rule(tokens=TOKENS, keep=st.booleans(), cap=st.none() | st.integers(0, 12))
    def match(self, tokens: list[int], keep: bool, cap: int | None) -> None:
        limit = len(tokens) if cap is None else min(cap, len(tokens))
        expected = best_match(self.cache, tokens, limit)
        m = self.cache.match(tokens, max_tokens=cap, partial_block=True)
        assert (m.num_tokens, m.partial_tokens) == expected
        assert m.num_tokens + m.partial_tokens <= limit
        tree = self.cache.tree
        for i, block in enumerate(m.block_ids):
            assert tree.tokens[block].tolist() == tokens[3 * i : 3 * i + 3]
        held = list(m.block_ids)
        if m.partial_block is not None:
            assert 0 < m.partial_tokens < 3
            stored = tree.tokens[m.partial_block, : m.partial_tokens].tolist()
            assert stored == tokens[m.num_tokens : m.num_tokens + m.partial_tokens]
            held.append(m.partial_block)
        if keep and held:
            self.held.append(held)
        elif held:
            self.cache.release(held)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        if self.held:
            self.cache.release(self.held.pop(data.draw(st.integers(0, len(self.held) - 1))))

    @rule(n=st.integers(1, 4))
    def allocate_and_free(self, n: int) -> None:  # evicts cached leaves, partial ones too
        if self.cache.can_allocate(n):
            self.cache.release(self.cache.allocate(n))

    @rule(tokens=TOKENS)
    def pin(self, tokens: list[int]) -> None:
        if self.cache.pin(tokens):
            self.pinned.append(tokens)

    @rule()
    def unpin(self) -> None:
        if self.pinned:
            self.cache.unpin(self.pinned.pop())

    @rule()
    def reset(self) -> None:
        self.cache.reset()

    @invariant()
    def consistent(self) -> None:
        self.cache.check_invariants()
        held = Counter(b for blocks in self.held for b in blocks)
        assert all(self.cache.pool.ref[b] == r for b, r in held.items())


PartialBlockMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestPartialBlockMachine = PartialBlockMachine.TestCase
