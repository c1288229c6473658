"""The ordered set of evictable leaves: which cached blocks go first when the pool runs dry.

A node is in the index exactly when it is a non-root leaf, unpinned, and its last block has no
reference (so at least its tail can be evicted). Keys order eviction: lower priority first, then
least recently used; the node index breaks ties deterministically.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from prefixcache.radix_node import RadixNode

IndexKey = tuple[int, int, int]


class EvictionIndex:
    """A SortedList of ``(priority, last_access, node idx)`` keys, one per evictable leaf."""

    def __init__(self) -> None:
        self._keys: SortedList = SortedList()

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self):
        return iter(self._keys)

    def set_evictable(self, node: RadixNode, evictable: bool) -> None:
        """Put ``node`` in the index under its current key, or take it out."""
        new_key = (node.priority, node.last_access, node.idx) if evictable else None
        old_key = node.index_key
        if old_key == new_key:
            return
        if old_key is not None:
            self._keys.remove(old_key)
        if new_key is not None:
            self._keys.add(new_key)
        node.index_key = new_key

    def first(self) -> IndexKey:
        """The key of the node to evict next (caller checked the index is not empty)."""
        return self._keys[0]

    def keys(self) -> list[IndexKey]:
        return list(self._keys)
