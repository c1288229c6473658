"""Events a cache-aware router or a second tier consumes: which block hashes came and went."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockStored:
    """Blocks newly cached, in chain order; ``parent_block_hash`` is None at a namespace root."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks that left the cache (evicted or reset)."""

    block_hashes: list[int]


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every block left the cache (a reset or a restart): forget all of this cache's blocks."""


CacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
