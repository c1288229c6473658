"""Moving full blocks between the pool and a host-memory tier (``HostTierIndex``): what a
``PrefixCache`` with a tier does when it evicts, and when a prompt's next blocks are found in
the tier instead of the pool.

* **Write-back on eviction**: a full block leaving the pool is offered to the tier; the cache
  queues a ``TierCopy(block, slot)`` for the engine, which copies the block's bytes into the
  slot before anything writes into that pool block again (before the next step's copies and
  forward: ``PrefixCache.take_tier_copies``).
* **Promotion**: before a prompt's match, the blocks after its cached path that the tier holds
  (confirmed by namespace, parent hash and tokens) get fresh pool blocks, are cached in the tree
  as if computed, and a load ``TierCopy`` is queued for each; the match that follows finds them.
  The tier keeps its copy (it is inclusive), so a promoted block evicted again before its load
  ran is not written back over good bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from prefixcache.errors import CacheFull
from prefixcache.hashing import chain_block_hashes

if TYPE_CHECKING:
    from prefixcache.cache import PrefixCache
    from prefixcache.radix_node import RadixNode


def offer_evicted(cache: PrefixCache, node: RadixNode, count: int) -> None:
    """Offer the last ``count`` (full) blocks of leaf ``node``, about to be evicted, to the
    tier; queue a write-back for each block it takes."""
    tier = cache.host_tier
    assert tier is not None
    tree = cache.tree
    ids = node.block_ids
    removed = ids[len(ids) - count :]
    if count < len(ids):
        parent_hash = int(tree.hashes[ids[len(ids) - count - 1]])
    else:
        parent = node.parent
        assert parent is not None
        parent_hash = parent.key if parent.is_root else int(tree.hashes[parent.block_ids[-1]])
    root = node
    while root.parent is not None:
        root = root.parent
    name = tree._root_names[root.idx]
    hashes = [int(h) for h in tree.hashes[removed]]
    slots = tier.offer(name, parent_hash, hashes, tree.tokens[removed])
    cache._tier_writebacks.extend(
        (int(block), slot) for block, slot in zip(removed.tolist(), slots, strict=True)
        if slot >= 0
    )  # fmt: skip


def promote(
    cache: PrefixCache,
    tokens: np.ndarray,  # [num_tokens] int32
    salt: str | None,
    limit: int,
    extra_keys: tuple,
) -> int:
    """Cache in the pool the blocks after ``tokens``' cached path (within ``limit`` tokens)
    that the host tier and then the lower tier hold, queueing their loads; returns how many
    blocks were promoted (0 when the tiers hold none of them or the pool cannot take them)."""
    bs = cache.block_size
    name = cache._namespace(salt, extra_keys)
    # the cached path, held (so the allocation below cannot evict it) and refreshed
    match = cache.match(tokens, salt, max_tokens=limit, extra_keys=extra_keys, count=False)
    held = np.asarray(match.block_ids, dtype=np.int32)
    start, end = len(held), limit // bs
    parent_hash = int(cache.tree.hashes[held[-1]]) if start else cache.tree.namespace_hash(name)
    hashes = chain_block_hashes(tokens, bs, start, end, parent_hash, cache.tree.hasher)
    blocks = tokens[start * bs : end * bs].reshape(-1, bs)  # [end - start, bs]
    tier = cache.host_tier
    slots = tier.find(name, parent_hash, hashes, blocks) if tier is not None and hashes else []
    payloads: list[bytes] = []
    if cache.lower_tier is not None and len(slots) < len(hashes):
        rest = len(slots)
        after = hashes[rest - 1] if rest else parent_hash
        rows = [tuple(row) for row in blocks[rest:].tolist()]
        handles = cache.lower_tier.find(name, after, hashes[rest:], rows)
        payloads = cache.lower_tier.fetch(name, handles) if handles else []
    count = len(slots) + len(payloads)
    if not count:
        cache.release(held)
        return 0
    if tier is not None:
        tier.hold_for_load(slots)  # the allocation's write-backs must not reuse these slots
    try:
        fresh = cache.allocate(count)
    except CacheFull:
        cache.release(held)
        return 0
    covered = (start + count) * bs
    ids = np.concatenate([held, np.asarray(fresh, dtype=np.int32)])
    cache.insert(tokens[:covered], ids, salt, extra_keys=extra_keys)
    cache.release(ids)
    cache._tier_loads.extend(zip(fresh[: len(slots)], slots, strict=True))
    cache._disk_loads.extend(zip(fresh[len(slots) :], payloads, strict=True))
    cache.tier_hit_blocks += len(slots)
    cache.lower_tier_hit_blocks += len(payloads)
    return count
