"""One node of the path-compressed radix tree: an edge holding a run of cached blocks."""

from __future__ import annotations

import numpy as np

EMPTY_BLOCKS = np.zeros(0, dtype=np.int32)


class RadixNode:
    """A run of cached blocks that always appear together on one path.

    ``block_ids`` are physical block ids in chain order; their tokens and hashes live in the
    tree's per-block tables. ``key`` is the hash of the first block (the key in the parent's
    ``children``); a root has no parent, no blocks and ``key`` = its namespace hash.
    ``pin_count`` > 0 keeps the node (and so its whole path) out of eviction.
    ``index_key`` is the node's entry in the eviction index, None when it is not evictable.
    """

    __slots__ = (
        "block_ids",
        "children",
        "idx",
        "index_key",
        "key",
        "last_access",
        "parent",
        "pin_count",
        "priority",
    )

    def __init__(
        self,
        idx: int,
        parent: RadixNode | None,
        key: int,
        block_ids: np.ndarray,  # [num_blocks] int32
        priority: int,
        last_access: int,
    ) -> None:
        self.idx = idx
        self.parent = parent
        self.key = key
        self.block_ids = block_ids
        self.children: dict[int, RadixNode] | None = None
        self.pin_count = 0
        self.priority = priority
        self.last_access = last_access
        self.index_key: int | None = None

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)

    def add_child(self, child: RadixNode) -> None:
        if self.children is None:
            self.children = {}
        self.children[child.key] = child

    def remove_child(self, child: RadixNode) -> None:
        assert self.children is not None and self.children.get(child.key) is child
        del self.children[child.key]
        if not self.children:
            self.children = None

    def __repr__(self) -> str:
        return (
            f"RadixNode(idx={self.idx}, blocks={self.block_ids.tolist()}, "
            f"children={len(self.children or ())}, pins={self.pin_count})"
        )
