"""The bytes of the host-memory KV tier: per layer, K and V slots of one block each, in the
pool's element dtype, and the copies between them and the paged pool that the prefix cache
queues (``PrefixCache.take_tier_copies``).

On a CPU engine the slots are rows after the pool's own in the same per-layer tensors
(``PagedKVCache(extra_rows=...)``): a tier of host memory beside the pool, whose copies are
block copies within one tensor, every layer in one compiled call where the CPU kernels run
(``block_copier``; about 5x a gather-then-scatter in torch). On a GPU engine the slots are
pinned host memory. A quantized pool's tier holds the quantized elements as they are (the
scales are per layer and static), so a block loaded back is bitwise the block evicted. With a
``TierCodec`` (``kv_tier_dtype`` fp8/int8 under a float pool) the slots are tensors of their own
in the codec's dtype: a write-back quantizes, a load reads back in the pool's dtype.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from prefixcache.engine.kv_cache import PagedKVCache
from prefixcache.engine.kv_tier_codec import TierCodec
from prefixcache.engine.latency_histogram import LatencyHistogram
from prefixcache.host_tier import TierCopy
from prefixcache.kernels import block_copier


class HostKVTier:
    """``num_slots`` blocks of host memory for every layer of ``kv``'s pools (on CPU without a
    codec, the ``kv.k_rows`` / ``kv.v_rows`` rows past the pool, which must be that many)."""

    def __init__(self, kv: PagedKVCache, num_slots: int, codec: TierCodec | None = None) -> None:
        self.kv = kv
        self.codec = codec
        self.num_slots = num_slots
        self.writebacks = 0
        self.loads = 0
        self.store_seconds = LatencyHistogram()  # each batch of write-backs
        self.load_seconds = LatencyHistogram()  # each batch of loads
        pool = kv.k[0]
        self.in_pool_rows = not pool.is_cuda and codec is None
        if self.in_pool_rows:
            if kv.k_rows[0].shape[0] < kv.num_blocks + num_slots:
                raise ValueError(f"the pool tensors hold no {num_slots} rows for the tier")
            self.k = [rows[kv.num_blocks : kv.num_blocks + num_slots] for rows in kv.k_rows]
            self.v = [rows[kv.num_blocks : kv.num_blocks + num_slots] for rows in kv.v_rows]
            self._copy_rows = block_copier(kv.k_rows, kv.v_rows)
        else:
            shape = (num_slots, *pool.shape[1:])  # [slots, block_size, kv_heads, head_dim]
            dtype = pool.dtype if codec is None else codec.dtype
            pin = pool.is_cuda
            self.k = [torch.empty(shape, dtype=dtype, pin_memory=pin) for _ in kv.k]
            self.v = [torch.empty(shape, dtype=dtype, pin_memory=pin) for _ in kv.k]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    @torch.inference_mode()
    def apply(self, writebacks: Sequence[TierCopy], loads: Sequence[TierCopy]) -> None:
        """Carry out the cache's copies: every write-back (pool block -> slot), then every
        load (slot -> pool block), in every layer."""
        for copies, to_tier in ((writebacks, True), (loads, False)):
            if copies:
                start = time.perf_counter()
                self._copy(copies, to_tier)
                seconds = (self.store_seconds if to_tier else self.load_seconds)
                seconds.observe(time.perf_counter() - start, len(copies))
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
        codec = self.codec
        pools = [*self.kv.k, *self.kv.v]
        for i, (pool, host) in enumerate(zip(pools, [*self.k, *self.v], strict=True)):
            if to_tier:
                block_values = pool.index_select(0, blocks.to(device))
                if codec is not None:
                    block_values = codec.encode(i, block_values)
                # as raw bytes: index_copy_ has no fp8 kernel on every device
                host.view(torch.uint8).index_copy_(0, slots, block_values.cpu().view(torch.uint8))
            else:
                stored = host.view(torch.uint8).index_select(0, slots).view(host.dtype)
                stored = stored.to(device)
                pool.index_copy_(0, blocks.to(device),
                                 stored if codec is None else codec.decode(i, stored))
