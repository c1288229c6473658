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
  ran is not written back over good bytes. Past the host tier's run, the lower tier (disk,
  shared store) is asked the same way; its payloads are written into fresh blocks
  (``PrefixCache.take_disk_loads``).
* **Reading the lower tier ahead**: an engine need not read it on its step loop:
  ``find_in_lower_tier`` says which handles to fetch, a background reader fetches them while the
  request waits, and ``promote(fetched=...)`` then takes the payloads without touching the tier.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

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


class LowerTierLookup(NamedTuple):
    """Full blocks past a prompt's cached path (pool, then host tier) that the lower tier
    keeps: fetch ``handles`` (``LowerTier.fetch``), then hand ``promote`` the payloads by the
    chain hash each answers (``hashes[i]`` for ``handles[i]``)."""

    name: Hashable
    hashes: list[int]
    handles: list[Any]


def find_in_lower_tier(
    cache: PrefixCache,
    tokens: np.ndarray,  # [num_tokens] int32
    salt: str | None,
    limit: int,
    extra_keys: tuple,
) -> LowerTierLookup | None:
    """What of ``tokens[:limit]`` past the pool's cached path and the host tier's blocks the
    lower tier keeps (confirmed by parent and tokens); None when it keeps none of them. Takes
    no reference and moves nothing (the host tier's recency is refreshed)."""
    if cache.lower_tier is None:
        return None
    name = cache._namespace(salt, extra_keys)
    path = cache.tree.walk(name, tokens, limit // cache.block_size)
    run = _next_blocks(cache, tokens, name, path.num_blocks, path.parent_hash, limit)
    if run.lower_start == len(run.hashes):
        return None
    after = run.hashes[run.lower_start - 1] if run.lower_start else path.parent_hash
    rows = [tuple(row) for row in run.blocks[run.lower_start :].tolist()]
    hashes = run.hashes[run.lower_start :]
    handles = cache.lower_tier.find(name, after, hashes, rows)
    return LowerTierLookup(name, hashes[: len(handles)], handles) if handles else None


def promote(
    cache: PrefixCache,
    tokens: np.ndarray,  # [num_tokens] int32
    salt: str | None,
    limit: int,
    extra_keys: tuple,
    fetched: Mapping[int, Any] | None = None,
) -> int:
    """Cache in the pool the blocks after ``tokens``' cached path (within ``limit`` tokens)
    that the host tier and then the lower tier hold, queueing their loads; returns how many
    blocks were promoted (0 when the tiers hold none of them or the pool cannot take them).

    The lower tier's payloads come from ``fetched`` (chain hash -> payload, as fetched for a
    ``find_in_lower_tier`` lookup) when it is given: the lower tier is not read then, and the
    run stops at the first block ``fetched`` lacks. Without it they are read now."""
    bs = cache.block_size
    name = cache._namespace(salt, extra_keys)
    # the cached path, held (so the allocation below cannot evict it) and refreshed
    match = cache.match(tokens, salt, max_tokens=limit, extra_keys=extra_keys, count=False)
    held = np.asarray(match.block_ids, dtype=np.int32)
    start = len(held)
    parent_hash = int(cache.tree.hashes[held[-1]]) if start else cache.tree.namespace_hash(name)
    run = _next_blocks(cache, tokens, name, start, parent_hash, limit)
    slots = run.slots
    rest = run.hashes[run.lower_start :]
    payloads: list[Any] = []
    if fetched is not None:
        for block_hash in rest:
            if block_hash not in fetched:
                break
            payloads.append(fetched[block_hash])
    elif cache.lower_tier is not None and rest:
        after = run.hashes[run.lower_start - 1] if run.lower_start else parent_hash
        rows = [tuple(row) for row in run.blocks[run.lower_start :].tolist()]
        handles = cache.lower_tier.find(name, after, rest, rows)
        payloads = cache.lower_tier.fetch(name, handles) if handles else []
    count = len(slots) + len(payloads)
    if not count:
        cache.release(held)
        return 0
    tier = cache.host_tier
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


class _NextBlocks(NamedTuple):
    hashes: list[int]  # chain hashes of the full blocks after the cached path, within the limit
    blocks: np.ndarray  # [len(hashes), block_size] int32: their tokens
    slots: list[int]  # host-tier slots of the first of them (the host tier's run)
    lower_start: int  # index in ``hashes`` where the host tier's run ends


def _next_blocks(cache: PrefixCache, tokens: np.ndarray, name: Hashable, start: int,
                 parent_hash: int, limit: int) -> _NextBlocks:  # fmt: skip
    """The full blocks of ``tokens[:limit]`` after the first ``start`` (the cached path, whose
    last hash is ``parent_hash``) and the run of them the host tier holds."""
    bs = cache.block_size
    end = limit // bs
    hashes = chain_block_hashes(tokens, bs, start, end, parent_hash, cache.tree.hasher)
    blocks = tokens[start * bs : end * bs].reshape(-1, bs)  # [end - start, bs]
    tier = cache.host_tier
    slots = tier.find(name, parent_hash, hashes, blocks) if tier is not None and hashes else []
    return _NextBlocks(hashes, blocks, slots, len(slots))
