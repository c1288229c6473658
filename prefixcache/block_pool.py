"""Reference counts and the free list of a fixed set of physical KV blocks.

The pool does not know which blocks are cached: the cache tells it where a block goes when
its last reference is dropped (back to the free list, or kept in the tree as evictable).
"""

from __future__ import annotations

import numpy as np


class BlockPool:
    """``ref[b]`` is the number of holders of block ``b``; free blocks sit on a stack."""

    def __init__(self, num_blocks: int) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.ref = np.zeros(num_blocks, dtype=np.int32)  # [num_blocks]
        # Stack of free block ids; the top is popped first, so block 0 goes out first.
        self._free = np.arange(num_blocks - 1, -1, -1, dtype=np.int32)  # [num_blocks]
        self._free_top = num_blocks
        self.num_in_use = 0

    @property
    def num_free(self) -> int:
        return self._free_top

    def free_block_ids(self) -> np.ndarray:  # [num_free] int32
        return self._free[: self._free_top]

    def take_free(self, n: int) -> list[int]:
        """Pop ``n`` free blocks (caller checked there are enough) and give each ref 1."""
        top = self._free_top
        self._free_top = top - n
        self.num_in_use += n
        if n == 1:  # the decode path: one block at a time, no array round trip
            block = int(self._free[top - 1])
            self.ref[block] = 1
            return [block]
        ids = self._free[top - n : top][::-1]
        self.ref[ids] = 1
        return ids.tolist()

    def put_free(self, ids: np.ndarray) -> None:  # ids: [n] int32, all with ref 0
        top = self._free_top
        self._free[top : top + len(ids)] = ids
        self._free_top = top + len(ids)

    def drop_ref(self, block: int) -> int:
        """One reference fewer on ``block`` (the caller checked it holds one); returns the
        count left. The scalar path of ``add_refs(ids, -1)``, as ``take_free(1)`` is of a
        larger ``take_free``."""
        left = int(self.ref[block]) - 1
        self.ref[block] = left
        if left == 0:
            self.num_in_use -= 1
        return left

    def acquire_unique(self, ids: np.ndarray) -> None:  # ids: [n] distinct block ids
        """+1 reference on each of ``ids`` (no duplicates, so plain fancy indexing is exact)."""
        before = self.ref[ids]
        self.num_in_use += int(np.count_nonzero(before == 0))
        self.ref[ids] = before + 1

    def add_refs(self, ids: np.ndarray, counts: np.ndarray) -> None:
        """Add ``counts[i]`` references to distinct block ``ids[i]`` (counts may be negative).

        Returns nothing; the caller has checked no count goes below zero.
        """
        before = self.ref[ids]
        after = before + counts
        self.ref[ids] = after
        self.num_in_use += int(np.count_nonzero(after > 0)) - int(np.count_nonzero(before > 0))

    def check_invariants(self, cached: np.ndarray) -> None:  # cached: [num_blocks] bool
        """Free list == exactly the uncached blocks with no reference; counts agree."""
        assert (self.ref >= 0).all(), "negative reference count"
        free = self.free_block_ids()
        assert len(np.unique(free)) == len(free), "a block is twice on the free list"
        assert (self.ref[free] == 0).all(), "a referenced block is on the free list"
        assert not cached[free].any(), "a cached block is on the free list"
        expected_free = int(np.count_nonzero((self.ref == 0) & ~cached))
        assert expected_free == len(free), f"{expected_free} free blocks, {len(free)} listed"
        assert self.num_in_use == int(np.count_nonzero(self.ref > 0)), "in-use count drifted"
