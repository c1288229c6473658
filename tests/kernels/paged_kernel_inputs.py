"""Random paged-attention inputs for the kernel tests: a pool, block tables, varlen batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefixcache.kernels.quantization import kv_storage_dtype, scales_from_amax
from prefixcache.kernels.reference.kv_store import store_kv_reference


@dataclass
class PagedPool:
    """A K/V pool holding the tokens of several sequences at scattered block ids."""

    k_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    k_scale: torch.Tensor | None  # [kv_heads, head_dim] float32 for quantized pools
    v_scale: torch.Tensor | None


def make_pool(
    lengths: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    *,
    num_blocks: int = 256,
    kv_cache_dtype: str = "auto",
    top_of_pool: bool = False,
    seed: int = 0,
) -> PagedPool:
    """Fill ``lengths[i]`` tokens of sequence i with random k/v at random (distinct) block ids,
    taken from the highest ids when ``top_of_pool``. Quantized pools get per-channel scales
    from the data (as calibration would) and hold the quantized values."""
    generator = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in lengths]
    needed = sum(per_seq)
    candidates = torch.arange(num_blocks - needed, num_blocks) if top_of_pool else None
    if candidates is None:
        candidates = torch.randperm(num_blocks, generator=generator)[:needed]
    ids = candidates[torch.randperm(needed, generator=generator)]
    width = max([*per_seq, 1])
    tables = torch.zeros(len(lengths), width, dtype=torch.int32)
    dtype = kv_storage_dtype(kv_cache_dtype, torch.float32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    values = torch.randn((2, needed * block_size, num_kv_heads, head_dim), generator=generator)
    k_scale = v_scale = None
    if dtype != torch.float32:
        k_scale = scales_from_amax(values[0].abs().amax(0), dtype, 1.0)
        v_scale = scales_from_amax(values[1].abs().amax(0), dtype, 1.0)
    start = 0
    for seq, count in enumerate(per_seq):
        tables[seq, :count] = ids[start : start + count].to(torch.int32)
        start += count
    slots = (ids[:, None] * block_size + torch.arange(block_size)).reshape(-1)  # used blocks
    store_kv_reference(values[0], values[1], k_cache, v_cache, slots, k_scale, v_scale)
    return PagedPool(k_cache, v_cache, tables, k_scale, v_scale)


def varlen_queries(
    new_lengths: list[int], num_heads: int, num_kv_heads: int, head_dim: int, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [T, heads, dim], k and v [T, kv_heads, dim], query_start_loc [num_seqs + 1] int32."""
    generator = torch.Generator().manual_seed(seed)
    total = sum(new_lengths)
    q = torch.randn((total, num_heads, head_dim), generator=generator)
    k = torch.randn((total, num_kv_heads, head_dim), generator=generator)
    v = torch.randn((total, num_kv_heads, head_dim), generator=generator)
    starts = torch.tensor([0, *new_lengths], dtype=torch.int32).cumsum(0).to(torch.int32)
    return q, k, v, starts
