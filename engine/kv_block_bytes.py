"""A pool block's bytes as the persistent tiers store them: every layer's K block, then every
layer's V block, raw. ``gather`` copies blocks out of the pool (engine thread, one gather per
layer for all of them), ``payloads`` cuts that copy into one payload per block (any thread),
``load`` writes payloads back into pool blocks (one scatter per layer)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prefixcache.engine.kv_cache import PagedKVCache


class BlockBytes:
    """The byte layout of ``kv``'s blocks (``record_bytes`` per block)."""

    def __init__(self, kv: PagedKVCache) -> None:
        self.kv = kv
        self.pools = [*kv.k, *kv.v]
        self.record_bytes = sum(p[0].numel() * p.element_size() for p in self.pools)

    @torch.inference_mode()
    def gather(self, blocks: Sequence[int]) -> list[torch.Tensor]:  # each [n, ...], on the CPU
        """Copies of pool blocks ``blocks`` (the pool may be written again right after)."""
        index = torch.tensor(list(blocks), dtype=torch.int64)
        return [pool.index_select(0, index.to(pool.device)).cpu() for pool in self.pools]

    def payloads(self, gathered: list[torch.Tensor]) -> list[memoryview]:
        """One payload per gathered block."""
        count = gathered[0].shape[0]
        rows = torch.cat([g.reshape(count, -1).view(torch.uint8) for g in gathered], dim=1)
        array = rows.numpy()  # [n, record_bytes]
        return [memoryview(array[i]) for i in range(count)]

    @torch.inference_mode()
    def load(self, blocks: Sequence[int], payloads: Sequence[memoryview | bytes]) -> None:
        """Write each payload into its pool block."""
        rows = torch.stack([torch.frombuffer(_writable(p), dtype=torch.uint8) for p in payloads])
        index = torch.tensor(list(blocks), dtype=torch.int64)  # [n]
        offset = 0
        for pool in self.pools:
            width = pool[0].numel() * pool.element_size()
            part = rows[:, offset : offset + width].view(pool.dtype)  # [n, block elements]
            device = pool.device
            pool.index_copy_(0, index.to(device), part.reshape(-1, *pool.shape[1:]).to(device))
            offset += width


def _writable(payload: memoryview | bytes) -> memoryview | bytearray:
    """A buffer torch may wrap without a read-only warning."""
    if isinstance(payload, memoryview) and not payload.readonly:
        return payload
    return bytearray(payload)
