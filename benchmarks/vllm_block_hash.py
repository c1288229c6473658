"""Baselines for prefix matching: vLLM-style chained block hashes in a flat dict.

Reimplemented from vLLM's public description of automatic prefix caching: each full block of
`block_size` tokens is named by ``hash((parent_hash, tuple(block_tokens), extra_keys))`` with
the hash taken over ``pickle.dumps`` of that tuple (SHA-256 by default, xxh3_128 as the fast
option); blocks live in a dict ``hash -> block``, and a prefix match hashes the prompt block
by block and looks each hash up until the first miss. A third variant chains plain xxh3_64
over each block's raw int32 bytes (seeded by the parent hash), with no pickling.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import xxhash

NONE_HASH = hashlib.sha256(b"prefixcache benchmark root").digest()
"""The parent of the first block (vLLM seeds this per process; any constant will do here)."""

TupleHasher = Callable[[Any], Hashable]


def sha256_pickle(obj: Any) -> bytes:
    """SHA-256 digest of the pickled object (vLLM's default block hash)."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def xxh3_128_pickle(obj: Any) -> bytes:
    """xxh3_128 digest of the pickled object (the faster pickled variant)."""
    return xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def pickled_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    hash_fn: TupleHasher,
    extra_keys: tuple[Hashable, ...] | None = None,
) -> list[Hashable]:
    """Chained hashes of every full block: h_i = hash_fn((h_{i-1}, block tokens, extra_keys))."""
    hashes: list[Hashable] = []
    parent: Hashable = NONE_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_fn((parent, tuple(token_ids[start : start + block_size]), extra_keys))
        hashes.append(parent)
    return hashes


def pickled_match(
    token_ids: Sequence[int],
    block_size: int,
    hash_fn: TupleHasher,
    table: dict[Hashable, int],
    extra_keys: tuple[Hashable, ...] | None = None,
) -> list[int]:
    """Block ids of the longest cached prefix: hash block by block, stop at the first miss."""
    block_ids: list[int] = []
    parent: Hashable = NONE_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_fn((parent, tuple(token_ids[start : start + block_size]), extra_keys))
        block = table.get(parent)
        if block is None:
            break
        block_ids.append(block)
    return block_ids


def xxh3_64_chain_hashes(tokens: np.ndarray, block_size: int, seed: int = 0) -> list[int]:
    """h_i = xxh3_64(int32 bytes of block i, seed=h_{i-1}) over a C-contiguous int32 array."""
    data = memoryview(tokens).cast("B")
    step = block_size * 4
    hashes = []
    current = seed
    for start in range(0, (len(tokens) // block_size) * step, step):
        current = xxhash.xxh3_64_intdigest(data[start : start + step], current)
        hashes.append(current)
    return hashes


def xxh3_64_chain_match(
    tokens: np.ndarray, block_size: int, table: dict[int, int], seed: int = 0
) -> list[int]:
    """Like `pickled_match`, with the plain xxh3_64 chain over raw bytes (int32 array input)."""
    data = memoryview(tokens).cast("B")
    step = block_size * 4
    block_ids: list[int] = []
    current = seed
    for start in range(0, (len(tokens) // block_size) * step, step):
        current = xxhash.xxh3_64_intdigest(data[start : start + step], current)
        block = table.get(current)
        if block is None:
            break
        block_ids.append(block)
    return block_ids
