"""The bytes of the host-memory KV tier: per layer, K and V slots of one block each, in the
pool's element dtype, and the copies between them and the paged pool that the prefix cache
queues (``PrefixCache.take_tier_copies``).

On a CPU engine the tier is a second region of host memory beside the pool (a pool block costs
the same bytes, but the tier holds blocks the pool has evicted, so it adds capacity); on a GPU
engine it is pinned host memory. A quantized pool's tier holds the quantized elements as they
are (the scales are per layer and static), so a block loaded back is bitwise the block evicted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prefixcache.engine.kv_cache import PagedKVCache
from prefixcache.host_tier import TierCopy


class HostKVTier:
    """``num_slots`` blocks of host memory for every layer of ``kv``'s pools."""

    def __init__(self, kv: PagedKVCache, num_slots: int) -> None:
        pool = kv.k[0]
        shape = (num_slots, *pool.shape[1:])  # [slots, block_size, kv_heads, head_dim]
        pinned = pool.is_cuda

        def region() -> list[torch.Tensor]:
            return [torch.empty(shape, dtype=pool.dtype, pin_memory=pinned) for _ in kv.k]

        self.kv = kv
        self.k, self.v = region(), region()
        self.num_slots = num_slots
        self.writebacks = 0
        self.loads = 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    @torch.inference_mode()
    def apply(self, writebacks: Sequence[TierCopy], loads: Sequence[TierCopy]) -> None:
        """Carry out the cache's copies: every write-back (pool block -> slot), then every
        load (slot -> pool block), in every layer."""
        device = self.kv.k[0].device
        for copies, to_tier in ((writebacks, True), (loads, False)):
            if not copies:
                continue
            blocks = torch.tensor([c.block for c in copies], dtype=torch.int64)  # [n]
            slots = torch.tensor([c.slot for c in copies], dtype=torch.int64)  # [n]
            for pools, region in ((self.kv.k, self.k), (self.kv.v, self.v)):
                for pool, host in zip(pools, region, strict=True):
                    if to_tier:
                        host.index_copy_(0, slots, pool.index_select(0, blocks.to(device)).cpu())
                    else:
                        pool.index_copy_(
                            0, blocks.to(device), host.index_select(0, slots).to(device)
                        )
        self.writebacks += len(writebacks)
        self.loads += len(loads)
