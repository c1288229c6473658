"""PrefixIndexes: what every backend holds, one ClusterIndex per block size, asked per prompt.

Backends publishing events feed it through their subscribers (*precise*). For the others the
router keeps a shadow ``PrefixCache`` per backend of what it routed there, with LRU eviction
at the backend's capacity (*approximate*); the shadow's events feed the same index, so both
kinds are matched and scored alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from prefixcache import PrefixCache
from prefixcache.cluster_index import BackendId, ClusterIndex
from prefixcache.events import CacheEvent


class PrefixIndexes:
    """``cached_tokens(prompt, n)`` -> [n] tokens of ``prompt`` each backend 0..n-1 holds."""

    def __init__(self, approx_blocks: int = 65536, approx_block_size: int = 16) -> None:
        self._indexes: dict[int, ClusterIndex] = {}
        self._shadows: dict[BackendId, PrefixCache] = {}
        self.approx_blocks = approx_blocks
        self.approx_block_size = approx_block_size

    # ------------------------------------------------------------------ precise (events)
    def apply(self, backend: BackendId, event: CacheEvent) -> None:
        block_size = getattr(event, "block_size", None)
        if block_size is None:  # a removal or a clear: whichever index knows the backend
            for index in self._indexes.values():
                index.apply(backend, event)
            return
        index = self._indexes.get(block_size)
        if index is None:
            index = self._indexes[block_size] = ClusterIndex(block_size)
        index.apply(backend, event)

    def apply_all(self, backend: BackendId, events: Iterable[CacheEvent]) -> None:
        for event in events:
            self.apply(backend, event)

    def clear(self, backend: BackendId) -> int:
        """Forget all ``backend`` holds (and its shadow); returns the blocks forgotten."""
        shadow = self._shadows.pop(backend, None)
        if shadow is not None:
            shadow.set_event_listener(None)
        return sum(index.clear(backend) for index in self._indexes.values())

    # ------------------------------------------------------------------ approximate
    def record_routed(self, backend: BackendId, prompt: Sequence[int]) -> None:
        """The prompt was sent to ``backend``, which publishes no events: it will hold it."""
        shadow = self._shadows.get(backend)
        if shadow is None:
            shadow = PrefixCache(self.approx_blocks, self.approx_block_size)
            shadow.set_event_listener(lambda event, b=backend: self.apply(b, event))
            self._shadows[backend] = shadow
        tokens = np.asarray(prompt, dtype=np.int32)
        hit = shadow.match(tokens)
        wanted = len(tokens) // shadow.block_size - len(hit.block_ids)
        room = min(wanted, shadow.num_blocks - len(hit.block_ids))
        fresh = shadow.allocate(room) if room > 0 else []
        if fresh:
            end = (len(hit.block_ids) + room) * shadow.block_size
            shadow.insert(tokens[:end], hit.block_ids + fresh)
        shadow.release(hit.block_ids + fresh)

    # ------------------------------------------------------------------ queries
    def cached_tokens(self, prompt: Sequence[int], num_backends: int) -> np.ndarray:  # [n]
        cached = np.zeros(num_backends)
        for block_size, index in self._indexes.items():
            hashes = index.prompt_hashes(prompt)
            for backend, blocks in index.match(hashes).items():
                if isinstance(backend, int) and backend < num_backends:
                    cached[backend] = max(cached[backend], blocks * block_size)
        return cached

    def num_blocks(self, backend: BackendId) -> int:
        return sum(index.num_blocks(backend) for index in self._indexes.values())

    def check_invariants(self) -> None:
        for index in self._indexes.values():
            index.check_invariants()
        for shadow in self._shadows.values():
            shadow.check_invariants()
