"""Quantized KV tiers (``kv_tier_dtype`` "fp8" / "int8" under a float pool): blocks are
quantized as they leave the pool for a tier and read back in the pool's dtype, so a tier holds
about twice the blocks in the same bytes (half the disk and store traffic) at the precision of a
quantized pool: the same static per-layer, per-channel scales (``measure_kv_scales``), the same
rounding (``prefixcache.kernels.quantization``). Only blocks that went through a tier carry the
error; the tokens a request computes are exact. With "auto" the tier keeps the pool's dtype and
a block comes back bitwise as it left.

The codec's ``tag`` names its dtypes and a digest of its scales: the disk and shared tiers put it
in their store key, so blocks written under other scales are never decoded with these.
"""

from __future__ import annotations

import hashlib

import torch

from prefixcache.engine.kv_cache import PagedKVCache, measure_kv_scales
from prefixcache.kernels.quantization import dequantize, is_quantized, kv_storage_dtype, quantize

KV_TIER_DTYPES = ("auto", "fp8", "int8")


class TierCodec:
    """Quantizes pool blocks to ``dtype`` and back. ``scales`` lists one [num_kv_heads,
    head_dim] float32 scale per pool in the pools' order (every layer's K, then every V)."""

    def __init__(self, pool_dtype: torch.dtype, dtype: torch.dtype,
                 scales: list[torch.Tensor]) -> None:  # fmt: skip
        self.pool_dtype = pool_dtype
        self.dtype = dtype
        self.scales = scales
        digest = hashlib.sha256()
        for scale in scales:
            digest.update(scale.detach().float().cpu().contiguous().numpy().tobytes())
        self.tag = f"{pool_dtype}->{dtype}:{digest.hexdigest()[:16]}"

    @property
    def element_size(self) -> int:
        return torch.tensor([], dtype=self.dtype).element_size()

    def encode(self, pool_index: int,
               blocks: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """``blocks`` [n, block_size, kv_heads, head_dim] of pool ``pool_index``, quantized."""
        return quantize(blocks, self.scales[pool_index].to(blocks.device), self.dtype)

    def decode(self, pool_index: int,
               stored: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """``stored`` [n, block_size, kv_heads, head_dim] as ``encode`` made it, in the pool's
        dtype again."""
        return dequantize(stored, self.scales[pool_index].to(stored.device), self.pool_dtype)


def tier_storage_dtype(kv_tier_dtype: object, pool_dtype: torch.dtype) -> torch.dtype:
    """The element dtype the tiers store for ``kv_tier_dtype`` under a pool of ``pool_dtype``
    ("auto": the pool's); TypeError / ValueError for another name, or for a quantized dtype
    under a quantized pool (its tiers keep its elements as they are)."""
    if not isinstance(kv_tier_dtype, str):
        raise TypeError(f"kv_tier_dtype must be one of {KV_TIER_DTYPES}, got "
                        f"{type(kv_tier_dtype).__name__}")  # fmt: skip
    if kv_tier_dtype not in KV_TIER_DTYPES:
        raise ValueError(f"unknown kv_tier_dtype {kv_tier_dtype!r}; choose from "
                         f"{KV_TIER_DTYPES}")  # fmt: skip
    if kv_tier_dtype == "auto":
        return pool_dtype
    if is_quantized(pool_dtype):
        raise ValueError(f"kv_tier_dtype={kv_tier_dtype!r} needs a float KV pool; this pool "
                         f"stores {pool_dtype} already (its tiers keep its elements)")  # fmt: skip
    return kv_storage_dtype(kv_tier_dtype, pool_dtype)


def tier_codec(kv_tier_dtype: str, model: torch.nn.Module, kv: PagedKVCache) -> TierCodec | None:
    """The codec for ``kv_tier_dtype`` under ``kv``'s pool, its scales measured on ``model``:
    None when the tiers keep the pool's dtype."""
    dtype = tier_storage_dtype(kv_tier_dtype, kv.dtype)
    if dtype == kv.dtype:
        return None
    k_scales, v_scales = measure_kv_scales(model, dtype)
    return TierCodec(kv.dtype, dtype, [*k_scales, *v_scales])
