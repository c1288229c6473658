"""Chained block hashes: the names of cached blocks.

``h_i = hasher(tokens of block i as little-endian int32 bytes, seed=h_{i-1})`` and ``h_{-1}`` is
the namespace hash of (model fingerprint, cache salt, extra keys). The chain makes a block's hash
name its whole prefix, so a router, an event consumer or another tier can key blocks by hash.
Hashes only *find* candidates: the tree confirms every hit against the stored token ids, so a
collision, accidental or crafted, can only cost a miss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import xxhash

if TYPE_CHECKING:
    from prefixcache.tokens import CanonicalKeys

BlockHasher = Callable[[memoryview, int], int]
"""``hasher(block bytes, seed) -> unsigned 64-bit int``; the seed is the parent block's hash."""

HASH_SCHEME_VERSION = "prefixcache-blockhash/1"


def xxh3_block_hasher(data: memoryview, seed: int) -> int:
    """The default block hasher: 64-bit xxh3 seeded by the parent hash."""
    return xxhash.xxh3_64_intdigest(data, seed)


def checked_block_hasher(hasher: BlockHasher) -> BlockHasher:
    """``hasher`` as the cache calls it: the default xxh3 hasher as is; any other wrapped so
    that each result is checked to be an unsigned 64-bit int (numpy integers are converted),
    raising TypeError / ValueError naming the value before the cache stores it."""
    if hasher is xxh3_block_hasher:
        return hasher
    if not callable(hasher):
        raise TypeError(f"block_hasher must be callable, got {type(hasher).__name__}")

    def checked(data: memoryview, seed: int) -> int:
        value = hasher(data, seed)
        if type(value) is not int:
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise TypeError(
                    f"block_hasher must return an int, got {type(value).__name__} {value!r}"
                )
            value = int(value)
        if not 0 <= value < 2**64:
            raise ValueError(
                f"block_hasher returned {value}, outside the unsigned 64-bit range "
                "[0, 2**64) (reduce it, e.g. value % 2**64)"
            )
        return value

    return checked


def namespace_hash(model_fingerprint: str, salt: str | None, extra_keys: CanonicalKeys) -> int:
    """The chain's starting value for one (model, tenant salt, extra keys such as a LoRA id).

    ``extra_keys`` must be in the canonical form of ``tokens.canonical_extra_keys`` (type-tagged
    plain values, whose repr is exact), so that equal namespaces always hash alike; no extra
    keys hash as they always have."""
    payload = repr((HASH_SCHEME_VERSION, model_fingerprint, salt, extra_keys))
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
