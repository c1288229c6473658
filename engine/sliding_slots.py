"""The sliding-window layers' own, smaller KV pool: slots lent to logical blocks while a window
needs them (the hybrid KV cache of models with local and global layers).

The prefix cache's block ids are *logical* blocks. Full-attention layers store a logical
block's keys and values at its own row of their pools. Sliding-window layers (window ``W``)
only ever read the last ``W`` keys, so their pools have ``num_slots`` rows (far fewer than the
logical blocks) and ``SlidingSlots`` maps logical blocks to slots:

* A running request *holds* the slots of the blocks that cover its window: the keys the
  step's new tokens see, ``[context - W + 1, context + new)`` (``window_blocks``). As its
  context grows the window slides, and blocks behind it are let go: their slots stay assigned
  (their keys still valid) but may be taken by another block, least recently let go first.
* A logical block keeps its slot while nobody takes it, so a cached prefix whose last window
  still has its slots is a usable hit (``usable_prefix``), even when the early blocks' slots
  went long ago. Slots of blocks the prefix cache evicted go first: no hit can use them. A
  hit whose last window lost a slot is shortened to the longest prefix whose window is whole.
* A block copied this step (a copy-on-write source, a partly filled cached block) is
  ``protect``-ed until the next step, so its slot cannot be taken before the copy runs.

Pure bookkeeping (numpy, no torch): the scheduler holds and lets go, the runner translates
block tables and slot mappings with ``slot_table``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

import numpy as np

from prefixcache import CopyOp

NO_SLOT = -1
SCAN = 32  # takeable slots looked at for one whose keys no hit can use


class SlidingSlots:
    """Slots ``0 .. num_slots - 1`` for logical blocks ``0 .. num_blocks - 1``.

    Every slot is either held (by requests' windows or a copy this step) or in the LRU of
    slots that may be taken, unassigned ones first."""

    def __init__(self, num_blocks: int, num_slots: int, block_size: int, window: int,
                 cached: np.ndarray | None = None) -> None:  # fmt: skip
        """``cached``: a view of the prefix cache's per-block node index (``RadixTree.node_of``,
        -1 for a block the tree does not hold): a slot whose block is not cached is taken
        before the least recently let go of the others."""
        if num_slots < 1 or num_blocks < 1 or block_size < 1 or window < 1:
            raise ValueError("num_blocks, num_slots, block_size and window must be positive")
        self.num_blocks = num_blocks
        self.num_slots = num_slots
        self.block_size = block_size
        self.window = window
        self.cached = cached
        self.slot_of = np.full(num_blocks, NO_SLOT, dtype=np.int64)  # logical block -> slot
        self.block_of = np.full(num_slots, NO_SLOT, dtype=np.int64)  # slot -> logical block
        self.holds = np.zeros(num_slots, dtype=np.int64)  # windows + copies holding a slot
        self.takeable: OrderedDict[int, None] = OrderedDict((s, None) for s in range(num_slots))
        self.held: dict[Hashable, list[int]] = {}  # holder -> the logical blocks it holds
        self.protected: list[int] = []  # blocks copied this step
        self.num_taken = 0  # slots taken from a block whose keys they held
        self.num_shortened_hits = 0  # hits cut back because their last window lost a slot
        self.shortened_tokens = 0  # prompt tokens those cuts recomputed

    # ------------------------------------------------------------------ windows
    def window_blocks(self, context: int, end: int) -> range:
        """Indices (into a request's block list) of the blocks that hold the keys tokens
        ``context .. end - 1`` see: positions ``max(0, context - W + 1) .. end - 1``."""
        first = max(0, context - self.window + 1) // self.block_size
        return range(first, -(-end // self.block_size))

    @staticmethod
    def min_slots(window: int, block_size: int, max_num_batched_tokens: int) -> int:
        """The fewest slots one request alone can run with: its window, one step's tokens, a
        block the window straddles and a copied block."""
        return -(-(window - 1) // block_size) + -(-max_num_batched_tokens // block_size) + 3

    def usable_prefix(self, block_ids: Sequence[int], num_tokens: int) -> int:
        """The longest prefix, at most ``num_tokens`` of the tokens ``block_ids`` hold (full
        blocks, then possibly one partly filled), ending at ``num_tokens`` or at a block
        boundary, whose last window's blocks all have slots; 0 when none has."""
        bs = self.block_size
        has = self.slot_of[np.asarray(block_ids, dtype=np.int64)] >= 0 if block_ids else []
        candidates = [num_tokens] + [j * bs for j in range(num_tokens // bs, -1, -1)
                                     if j * bs < num_tokens]  # fmt: skip
        for length in candidates:
            if length == 0 or all(has[i] for i in self.window_blocks(length, length)):
                return length
        return 0

    def record_shortened(self, tokens: int) -> None:
        """Count a hit cut back by ``tokens`` (``usable_prefix`` said less than matched)."""
        self.num_shortened_hits += 1
        self.shortened_tokens += tokens

    # ------------------------------------------------------------------ holds
    def hold(self, holder: Hashable, blocks: Sequence[int]) -> bool:
        """Make ``blocks`` (logical ids) what ``holder`` holds: new ones get slots (unassigned
        slots first, then the least recently let go, which may be one this call lets go),
        ones it no longer lists are let go. False, and nothing held changed, when there are
        not enough slots to take."""
        old = self.held.get(holder, [])
        old_set, new_set = set(old), set(blocks)
        gone = [int(self.slot_of[b]) for b in old if b not in new_set]
        for slot in gone:
            self._let_go(slot)
        gained = [b for b in blocks if b not in old_set]
        lacking = sum(1 for b in gained if self.slot_of[b] == NO_SLOT)
        reusable = sum(1 for b in gained if self.slot_of[b] != NO_SLOT
                       and self.holds[self.slot_of[b]] == 0)  # fmt: skip
        if lacking > len(self.takeable) - reusable:
            for slot in gone:
                self._grab(slot)
            return False
        for block in gained:  # first the blocks with slots, so none is taken for another
            if self.slot_of[block] != NO_SLOT:
                self._grab(int(self.slot_of[block]))
        for block in gained:
            if self.slot_of[block] == NO_SLOT:
                self._assign(block)
        if blocks:
            self.held[holder] = list(blocks)
        else:
            self.held.pop(holder, None)
        return True

    def release(self, holder: Hashable) -> None:
        """Let go of everything ``holder`` holds."""
        self.hold(holder, [])

    def share(self, parent: Hashable, child: Hashable) -> None:
        """``child`` holds what ``parent`` holds (a fork sharing its blocks)."""
        blocks = self.held.get(parent, [])
        for block in blocks:
            self._grab(int(self.slot_of[block]))
        if blocks:
            self.held[child] = list(blocks)

    def protect(self, block: int) -> None:
        """Keep ``block``'s slot until ``end_copies`` (it is copied this step); it must have
        one."""
        slot = int(self.slot_of[block])
        if slot == NO_SLOT:
            raise ValueError(f"block {block} has no sliding slot to copy from")
        self._grab(slot)
        self.protected.append(block)

    def unprotect(self, block: int) -> None:
        """Undo one ``protect(block)`` of this step (its copy will not run)."""
        index = len(self.protected) - 1 - self.protected[::-1].index(block)
        del self.protected[index]
        self._let_go(int(self.slot_of[block]))

    def end_copies(self) -> None:
        """The last step's copies ran: their sources may be taken again."""
        for block in self.protected:
            self._let_go(int(self.slot_of[block]))
        self.protected = []

    def _grab(self, slot: int) -> None:
        if self.holds[slot] == 0:
            del self.takeable[slot]
        self.holds[slot] += 1

    def _let_go(self, slot: int) -> None:
        self.holds[slot] -= 1
        if self.holds[slot] == 0:
            self.takeable[slot] = None  # the most recently let go: taken last

    def _assign(self, block: int) -> None:
        slot = self._slot_to_take()
        del self.takeable[slot]
        previous = int(self.block_of[slot])
        if previous != NO_SLOT:
            self.slot_of[previous] = NO_SLOT
            self.num_taken += 1
        self.slot_of[block] = slot
        self.block_of[slot] = block
        self.holds[slot] = 1

    def _slot_to_take(self) -> int:
        """The least recently let go slot, unless one of the next ``SCAN`` holds no block or a
        block the prefix cache no longer holds (keys no hit can use): that one."""
        first = next(iter(self.takeable))
        if self.cached is None:
            return first
        for slot, _ in zip(self.takeable, range(SCAN), strict=False):
            block = int(self.block_of[slot])
            if block == NO_SLOT or self.cached[block] < 0:
                return slot
        return first

    # ------------------------------------------------------------------ translation
    def slot_table(self, blocks: np.ndarray) -> np.ndarray:  # same shape, int64 slots
        """Slots of logical ``blocks`` (any shape); 0 where a block has none (a sliding layer
        masks every key of such a block: it is outside the window)."""
        slots = self.slot_of[blocks]
        return np.where(slots >= 0, slots, 0)

    def slot_copies(self, ops: Sequence[CopyOp]) -> list[CopyOp]:
        """Copies of logical blocks as copies of their slots; one with a side without a slot
        is left out (its keys are outside every window that reads them)."""
        out = []
        for op in ops:
            src, dst = int(self.slot_of[op.src]), int(self.slot_of[op.dst])
            if src != NO_SLOT and dst != NO_SLOT:
                out.append(CopyOp(src, dst, op.num_tokens))
        return out

    # ------------------------------------------------------------------ reporting
    def stats(self) -> dict[str, int]:
        return {
            "sliding_window": self.window,
            "sliding_slots": self.num_slots,
            "sliding_slots_held": int(np.count_nonzero(self.holds)),
            "sliding_slots_unassigned": int(np.count_nonzero(self.block_of == NO_SLOT)),
            "sliding_slots_taken": self.num_taken,
            "sliding_shortened_hits": self.num_shortened_hits,
            "sliding_shortened_tokens": self.shortened_tokens,
        }

    def check_invariants(self) -> None:
        """AssertionError unless the block <-> slot maps are inverse, each slot's hold count is
        what the holders and copies hold, every held block has a slot, and the takeable slots
        are exactly the unheld ones."""
        assigned = np.flatnonzero(self.slot_of >= 0)
        assert np.array_equal(self.block_of[self.slot_of[assigned]], assigned)
        used = np.flatnonzero(self.block_of >= 0)
        assert np.array_equal(self.slot_of[self.block_of[used]], used)
        counts = np.zeros(self.num_slots, dtype=np.int64)
        for blocks in self.held.values():
            assert len(set(blocks)) == len(blocks), blocks
            for block in blocks:
                assert self.slot_of[block] >= 0, f"held block {block} has no slot"
                counts[self.slot_of[block]] += 1
        for block in self.protected:
            assert self.slot_of[block] >= 0, f"protected block {block} has no slot"
            counts[self.slot_of[block]] += 1
        assert np.array_equal(counts, self.holds), "hold counts differ from the holders"
        assert set(self.takeable) == set(np.flatnonzero(self.holds == 0).tolist())
