"""The bytes of the host-memory KV tier: per layer, K and V slots of one block each, in the
pool's element dtype, and the copies between them and the paged pool that the prefix cache
queues (``PrefixCache.take_tier_copies``).

On a CPU engine the slots are rows after the pool's own in the same per-layer tensors
(``PagedKVCache(extra_rows=...)``): a tier of host memory beside the pool, whose copies are
block copies within one tensor, every layer in one compiled call where the CPU kernels run
(``block_copier``; about 5x a gather-then-scatter in torch). On a GPU engine the slots are
pinned host memory. A quantized pool's tier holds the quantized elements as they are (the
scales are per layer and static), so a block loaded back is bitwise the block evicted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prefixcache.engine.kv_cache import PagedKVCache
from prefixcache.host_tier import TierCopy
from prefixcache.kernels import block_copier


class HostKVTier:
    """``num_slots`` blocks of host memory for every layer of ``kv``'s pools (on CPU, the
    ``kv.k_rows`` / ``kv.v_rows`` rows past the pool, which must be at least that many)."""

    def __init__(self, kv: PagedKVCache, num_slots: int) -> None:
        self.kv = kv
        self.num_slots = num_slots
        self.writebacks = 0
        self.loads = 0
        pool = kv.k[0]
        self.in_pool_rows = not pool.is_cuda
        if self.in_pool_rows:
            if kv.k_rows[0].shape[0] < kv.num_blocks + num_slots:
                raise ValueError(f"the pool tensors hold no {num_slots} rows for the tier")
            self.k = [rows[kv.num_blocks : kv.num_blocks + num_slots] for rows in kv.k_rows]
            self.v = [rows[kv.num_blocks : kv.num_blocks + num_slots] for rows in kv.v_rows]
            self._copy_rows = block_copier(kv.k_rows, kv.v_rows)
        else:
            shape = (num_slots, *pool.shape[1:])  # [slots, block_size, kv_heads, head_dim]
            self.k = [torch.empty(shape, dtype=pool.dtype, pin_memory=True) for _ in kv.k]
            self.v = [torch.empty(shape, dtype=pool.dtype, pin_memory=True) for _ in kv.k]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    @torch.inference_mode()
    def apply(self, writebacks: Sequence[TierCopy], loads: Sequence[TierCopy]) -> None:
        """Carry out the cache's copies: every write-back (pool block -> slot), then every
        load (slot -> pool block), in every layer."""
        for copies, to_tier in ((writebacks, True), (loads, False)):
            if copies:
                self._copy(copies, to_tier)
        self.writebacks += len(writebacks)
        self.loads += len(loads)

    def _copy(self, copies: Sequence[TierCopy], to_tier: bool) -> None:
        blocks = torch.tensor([c.block for c in copies], dtype=torch.int64)  # [n]
        slots = torch.tensor([c.slot for c in copies], dtype=torch.int64)  # [n]
        if self.in_pool_rows:
            rows = slots + self.kv.num_blocks
            pairs = torch.stack([blocks, rows] if to_tier else [rows, blocks], dim=1)  # [n, 2]
            self._copy_rows(pairs)
            return
        device = self.kv.k[0].device
        for pools, region in ((self.kv.k, self.k), (self.kv.v, self.v)):
            for pool, host in zip(pools, region, strict=True):
                if to_tier:
                    host.index_copy_(0, slots, pool.index_select(0, blocks.to(device)).cpu())
                else:
                    pool.index_copy_(0, blocks.to(device), host.index_select(0, slots).to(device))
