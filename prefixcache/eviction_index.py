"""The ordered set of evictable leaves: which cached blocks go first when the pool runs dry.

A node is in the index exactly when it is a non-root leaf, unpinned, and its last block has no
reference (so at least its tail can be evicted). Keys order eviction: lower priority first, then
least recently used; the node index breaks ties deterministically. A key is one Python int
(priority, recency and node index packed into bit fields), which keeps the per-node cost low.
"""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedList

from prefixcache.radix_node import RadixNode

MIN_PRIORITY = -(2**15)
MAX_PRIORITY = 2**15 - 1
_IDX_BITS = 32
_CLOCK_BITS = 64


def eviction_key(node: RadixNode) -> int:
    """``(priority, last_access, idx)`` packed so that int order is the tuple's order."""
    priority = node.priority - MIN_PRIORITY
    return (((priority << _CLOCK_BITS) | node.last_access) << _IDX_BITS) | node.idx


def node_index(key: int) -> int:
    return key & ((1 << _IDX_BITS) - 1)


class EvictionIndex:
    """A SortedList of packed keys, one per evictable leaf; ``node.index_key`` mirrors it."""

    def __init__(self) -> None:
        self._keys: SortedList = SortedList()

    def __len__(self) -> int:
        return len(self._keys)

    def node_indices(self) -> Iterator[int]:
        """Node indices in eviction order."""
        return (node_index(key) for key in self._keys)

    def set_evictable(self, node: RadixNode, evictable: bool) -> None:
        """Put ``node`` in the index under its current key, or take it out."""
        new_key = eviction_key(node) if evictable else None
        old_key = node.index_key
        if old_key == new_key:
            return
        if old_key is not None:
            self._keys.remove(old_key)
        if new_key is not None:
            self._keys.add(new_key)
        node.index_key = new_key

    def first(self) -> int:
        """The node index to evict next (caller checked the index is not empty)."""
        return node_index(self._keys[0])

    def keys(self) -> list[int]:
        return list(self._keys)
