"""Synthetic prompts and shared-prefix traffic that fill a `PrefixCache` the way an engine does.

Every request goes match -> allocate the rest -> insert -> release, so the cache ends with
its blocks cached (ref 0) in a tree of shared prefixes with unique suffixes.
"""

from __future__ import annotations

import numpy as np

from prefixcache import PrefixCache

BLOCK_SIZE = 16


def prompt_tokens(num_tokens: int, seed: int) -> np.ndarray:  # [num_tokens] int32
    return np.random.default_rng(seed).integers(0, 128_000, num_tokens, dtype=np.int32)


def cached_cache(tokens: np.ndarray, num_blocks: int) -> PrefixCache:
    """A cache in which all full blocks of ``tokens`` are cached (ref 0)."""
    cache = PrefixCache(num_blocks=num_blocks, block_size=BLOCK_SIZE)
    ids = cache.allocate(len(tokens) // BLOCK_SIZE)
    cache.insert(tokens, ids)
    cache.release(ids)
    return cache


def populate(
    cache: PrefixCache,
    groups: int,
    prefix_blocks: int,
    requests_per_group: int,
    suffix_blocks: int,
    seed: int,
) -> int:
    """Shared-prefix traffic as an engine drives it: per request match -> allocate the rest ->
    insert -> release. Each group shares one prefix; every request adds a unique suffix.
    Returns the number of requests served."""
    rng = np.random.default_rng(seed)
    suffix_len = suffix_blocks * BLOCK_SIZE
    total_blocks = prefix_blocks + suffix_blocks
    served = 0
    for _ in range(groups):
        prefix = rng.integers(0, 128_000, prefix_blocks * BLOCK_SIZE, dtype=np.int32)
        for _ in range(requests_per_group):
            first = served * suffix_len  # unique suffix tokens for every request
            suffix = np.arange(first, first + suffix_len, dtype=np.int32)
            prompt = np.concatenate((prefix, suffix))
            hit = cache.match(prompt)
            ids = hit.block_ids + cache.allocate(total_blocks - len(hit.block_ids))
            cache.insert(prompt, ids)
            cache.release(ids)
            served += 1
    return served


def full_cache(num_blocks: int, seed: int) -> PrefixCache:
    """A pool whose every block is cached and evictable (no free block left)."""
    cache = PrefixCache(num_blocks=num_blocks, block_size=BLOCK_SIZE)
    prefix_blocks, suffix_blocks, per_group = 8, 8, 15
    groups = num_blocks // (prefix_blocks + per_group * suffix_blocks)
    populate(cache, groups, prefix_blocks, per_group, suffix_blocks, seed)
    rest = cache.stats()["free"]
    if rest:
        ids = cache.allocate(rest)
        cache.insert(prompt_tokens(rest * BLOCK_SIZE, seed + 1), ids)
        cache.release(ids)
    stats = cache.stats()
    assert stats["free"] == 0 and stats["cached"] == num_blocks, stats
    return cache
