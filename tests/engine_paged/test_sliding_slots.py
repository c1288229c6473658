"""SlidingSlots: windows, holds, LRU taking, usable prefixes, protected copies, invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.engine.hybrid_kv_sizing import default_sliding_slots
from prefixcache.engine.sliding_slots import NO_SLOT, SlidingSlots


def test_window_blocks_cover_the_keys_new_tokens_see() -> None:
    slots = SlidingSlots(num_blocks=64, num_slots=8, block_size=4, window=6)
    assert list(slots.window_blocks(0, 3)) == [0]
    assert list(slots.window_blocks(10, 11)) == [1, 2]  # keys 5..10
    assert list(slots.window_blocks(12, 20)) == [1, 2, 3, 4]  # keys 7..19
    assert list(slots.window_blocks(8, 8)) == [0, 1]  # what token 8 will see: keys 3..7


def test_blocks_let_go_keep_their_keys_until_taken_least_recent_first() -> None:
    slots = SlidingSlots(num_blocks=16, num_slots=3, block_size=4, window=4)
    assert slots.hold("a", [0, 1])
    assert slots.hold("a", [1, 2])  # block 0 let go: still assigned
    assert slots.slot_of[0] != NO_SLOT and slots.holds[slots.slot_of[0]] == 0
    assert slots.hold("b", [5])  # no unassigned slot is left: block 0's is taken
    assert slots.slot_of[0] == NO_SLOT and slots.num_taken == 1
    assert not slots.hold("c", [7])  # every slot held: nothing changes
    assert "c" not in slots.held and slots.slot_of[7] == NO_SLOT
    slots.release("a")
    assert slots.hold("c", [7])  # takes block 1's slot (let go before block 2's)
    assert slots.slot_of[1] == NO_SLOT and slots.slot_of[2] != NO_SLOT
    slots.check_invariants()


def test_a_hold_may_reuse_the_slot_it_lets_go() -> None:
    slots = SlidingSlots(num_blocks=16, num_slots=2, block_size=4, window=4)
    assert slots.hold("a", [0, 1])
    assert slots.hold("a", [1, 2])  # block 0's slot goes to block 2
    assert slots.slot_of[0] == NO_SLOT
    slots.check_invariants()


def test_usable_prefix_needs_the_last_window_only() -> None:
    slots = SlidingSlots(num_blocks=32, num_slots=32, block_size=4, window=6)
    blocks = list(range(10))
    for block in blocks:
        slots._assign(block)
    slots.holds[:] = 0  # nobody holds them: cached blocks with their keys
    slots.takeable.update((s, None) for s in range(10))
    slots.check_invariants()
    slots.slot_of[[0, 1, 2]] = NO_SLOT  # early windows gone
    slots.block_of[[0, 1, 2]] = NO_SLOT
    assert slots.usable_prefix(blocks, 38) == 38  # keys 33..37: blocks 8, 9
    slots.slot_of[9] = NO_SLOT  # the partly filled last block lost its slot
    slots.block_of[9] = NO_SLOT
    assert slots.usable_prefix(blocks, 38) == 36  # the full blocks' end: keys 31..35
    slots.slot_of[7] = NO_SLOT
    slots.block_of[7] = NO_SLOT
    assert slots.usable_prefix(blocks, 38) == 28  # keys 23..27: blocks 5, 6
    assert slots.usable_prefix(blocks[:3], 12) == 0


def test_protected_sources_survive_the_step() -> None:
    slots = SlidingSlots(num_blocks=16, num_slots=2, block_size=4, window=4)
    assert slots.hold("a", [0])
    slots.protect(0)
    slots.release("a")
    assert not slots.hold("b", [1, 2])  # block 0 is copied this step: one slot to take
    slots.end_copies()
    assert slots.hold("b", [1, 2])
    with pytest.raises(ValueError, match="no sliding slot"):
        slots.protect(0)
    slots.check_invariants()


def test_check_invariants_catches_a_wrong_count() -> None:
    slots = SlidingSlots(num_blocks=8, num_slots=4, block_size=4, window=4)
    assert slots.hold("a", [0, 1])
    slots.holds[slots.slot_of[0]] += 1
    with pytest.raises(AssertionError, match="hold counts"):
        slots.check_invariants()


def test_default_slots_cover_every_running_window_and_a_step() -> None:
    # 512-token windows of 16-token blocks: 32 blocks + 2 a request; 4,096 tokens: 256 blocks
    assert default_sliding_slots(512, 16, 64, 4096) == 64 * 34 + 256 + 64


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 40), st.integers(0, 6),
                          st.booleans()), max_size=40))  # fmt: skip
def test_random_holds_keep_the_invariants(ops: list[tuple[str, int, int, bool]]) -> None:
    slots = SlidingSlots(num_blocks=48, num_slots=10, block_size=4, window=8)
    for holder, first, count, copy in ops:
        blocks = list(range(first, min(48, first + count)))
        before = (slots.slot_of.copy(), dict(slots.held))
        if slots.hold(holder, blocks):
            assert all(slots.slot_of[b] != NO_SLOT for b in blocks)
            if copy and blocks:
                slots.protect(blocks[0])
        else:
            assert np.array_equal(slots.slot_of, before[0]) and slots.held == before[1]
        if copy and not blocks:
            slots.end_copies()
        slots.check_invariants()
    for holder in "abcd":
        slots.release(holder)
    slots.end_copies()
    slots.check_invariants()
    assert not slots.holds.any() and len(slots.takeable) == 10


def test_slots_of_blocks_the_cache_evicted_go_first() -> None:
    node_of = np.zeros(16, dtype=np.int32)  # every block cached...
    slots = SlidingSlots(num_blocks=16, num_slots=3, block_size=4, window=4, cached=node_of)
    assert slots.hold("a", [0, 1, 2])
    slots.release("a")  # let go in the order 0, 1, 2
    node_of[1] = -1  # ...until the tree evicts block 1
    assert slots.hold("b", [5])
    assert slots.slot_of[1] == NO_SLOT and slots.slot_of[0] != NO_SLOT  # not the LRU's block 0
    assert slots.hold("b", [5, 6])
    assert slots.slot_of[0] == NO_SLOT  # then least recently let go again
    slots.check_invariants()
