"""Chained block hashes: the names of cached blocks.

``h_i = hasher(tokens of block i as little-endian int32 bytes, seed=h_{i-1})`` and ``h_{-1}`` is
the namespace hash of (model fingerprint, cache salt, extra keys). The chain makes a block's hash
name its whole prefix, so a router, an event consumer or another tier can key blocks by hash.
Hashes only *find* candidates: the tree confirms every hit against the stored token ids, so a
collision, accidental or crafted, can only cost a miss.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np
import xxhash

BlockHasher = Callable[[memoryview, int], int]
"""``hasher(block bytes, seed) -> unsigned 64-bit int``; the seed is the parent block's hash."""

HASH_SCHEME_VERSION = "prefixcache-blockhash/1"


def xxh3_block_hasher(data: memoryview, seed: int) -> int:
    """The default block hasher: 64-bit xxh3 seeded by the parent hash."""
    return xxhash.xxh3_64_intdigest(data, seed)


def namespace_hash(
    model_fingerprint: str, salt: str | None, extra_keys: tuple[Hashable, ...]
) -> int:
    """The chain's starting value for one (model, tenant salt, extra keys such as a LoRA id)."""
    payload = repr((HASH_SCHEME_VERSION, model_fingerprint, salt, tuple(extra_keys)))
    return xxhash.xxh3_64_intdigest(payload.encode())


def chain_block_hashes(
    tokens: np.ndarray,  # [num_tokens] int32, C-contiguous
    block_size: int,
    first_block: int,
    end_block: int,
    parent_hash: int,
    hasher: BlockHasher,
) -> list[int]:
    """Hashes of full blocks ``first_block .. end_block - 1`` chained from ``parent_hash``."""
    data = memoryview(tokens).cast("B")
    block_bytes = block_size * 4
    hashes = []
    current = parent_hash
    for block in range(first_block, end_block):
        start = block * block_bytes
        current = hasher(data[start : start + block_bytes], current)
        hashes.append(current)
    return hashes
