"""A pool block's bytes as the persistent tiers store them: every layer's K block, then every
layer's V block, raw (in the tier codec's dtype when there is one). ``gather`` copies blocks out
of the pool (engine thread, one gather per layer for all of them), ``payloads`` cuts that copy
into one payload per block (any thread), ``load`` writes payloads back into pool blocks (one
scatter per layer)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from prefixcache.engine.kv_cache import PagedKVCache
from prefixcache.engine.kv_tier_codec import TierCodec
from prefixcache.kernels.quantization import is_quantized


class BlockBytes:
    """The byte layout of ``kv``'s blocks (``record_bytes`` per block), quantized by ``codec``
    when one is given."""

    def __init__(self, kv: PagedKVCache, codec: TierCodec | None = None) -> None:
        self.kv = kv
        self.codec = codec
        self.pools = [*kv.k, *kv.v]
        element = codec.element_size if codec is not None else self.pools[0].element_size()
        self.record_bytes = sum(p[0].numel() * element for p in self.pools)

    @torch.inference_mode()
    def gather(self, blocks: Sequence[int]) -> list[torch.Tensor]:  # each [n, ...], on the CPU
        """Copies of pool blocks ``blocks`` (the pool may be written again right after)."""
        index = torch.tensor(list(blocks), dtype=torch.int64)
        copies = []
        for i, pool in enumerate(self.pools):
            selected = pool.index_select(0, index.to(pool.device))
            if self.codec is not None:
                selected = self.codec.encode(i, selected)
            copies.append(selected.cpu())
        return copies

    def payloads(self, gathered: list[torch.Tensor],
                 out: np.ndarray | None = None) -> list[memoryview]:  # fmt: skip
        """One payload per gathered block: the rows of ``out`` ([>= n, >= record_bytes]
        uint8; bytes past ``record_bytes`` are left as they are) when given, else of a new
        array. Copies with numpy, on the calling thread alone: a tier's writer thread must not
        start torch's parallel regions beside the engine's (on 2 cores the two thread teams
        cost the model 6% of its speed where one copy of these bytes costs under 1%)."""
        count = gathered[0].shape[0]
        parts = [g.reshape(count, -1).view(torch.uint8).numpy() for g in gathered]  # views
        if out is None:
            array = np.concatenate(parts, axis=1)  # [n, record_bytes]
            return [memoryview(array[i]) for i in range(count)]
        offset = 0
        for part in parts:
            out[:count, offset : offset + part.shape[1]] = part
            offset += part.shape[1]
        return [memoryview(out[i]) for i in range(count)]

    @torch.inference_mode()
    def load(self, blocks: Sequence[int], payloads: Sequence[Payload]) -> None:
        """Write each payload into its pool block (one copy per layer, straight from the rows
        of a staging tensor when the payloads are such rows)."""
        rows = as_rows(payloads)  # [n, record_bytes] uint8
        index = torch.tensor(list(blocks), dtype=torch.int64)  # [n]
        stored = self.codec.dtype if self.codec is not None else self.pools[0].dtype
        element = rows.new_empty(0, dtype=stored).element_size()
        offset = 0
        for i, pool in enumerate(self.pools):
            width = pool[0].numel() * element
            # [n, block_size, kv_heads, head_dim], a view of the rows (no copy)
            part = rows[:, offset : offset + width].view(stored).unflatten(1, pool.shape[1:])
            part = part.to(pool.device)
            if self.codec is not None:
                part = self.codec.decode(i, part)
            if is_quantized(pool.dtype):  # index_copy_ has no fp8 kernel on every device
                pool.view(torch.uint8).index_copy_(0, index.to(pool.device),
                                                   part.view(torch.uint8))  # fmt: skip
            else:
                pool.index_copy_(0, index.to(pool.device), part)
            offset += width


Payload = memoryview | bytes | torch.Tensor  # a tensor payload: a [record_bytes] uint8 row


def as_rows(payloads: Sequence[Payload]) -> torch.Tensor:  # [n, record_bytes] uint8
    """The payloads as one matrix: a view when they are evenly spaced rows of one tensor (the
    disk tier's staging rows, each followed by its padding), else a stacked copy."""
    if payloads and all(isinstance(p, torch.Tensor) for p in payloads):
        first = payloads[0]
        width = first.numel()
        base = first.untyped_storage().data_ptr()
        step = payloads[1].storage_offset() - first.storage_offset() if len(payloads) > 1 \
            else width  # fmt: skip
        evenly = step >= width and all(
            p.untyped_storage().data_ptr() == base and p.is_contiguous() and p.numel() == width
            and p.storage_offset() == first.storage_offset() + i * step
            for i, p in enumerate(payloads)
        )  # fmt: skip
        if evenly:
            return first.as_strided((len(payloads), width), (step, 1))
        return torch.stack(list(payloads))
    rows = [p.numpy() if isinstance(p, torch.Tensor) else np.frombuffer(p, dtype=np.uint8)
            for p in payloads]  # fmt: skip
    return torch.from_numpy(np.stack(rows))  # one copy, read-only buffers welcome
