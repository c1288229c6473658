"""Triton paged prefill attention (interpreted) against the torch reference."""

from __future__ import annotations

import pytest
import torch
from paged_kernel_inputs import make_pool, varlen_queries

from prefixcache.kernels.reference.paged_attention import paged_prefill_attention_reference
from prefixcache.kernels.triton import paged_prefill_attention_triton

KV_HEADS_FOR_GROUP = {1: 1, 3: 1, 8: 1}
SMALL_TILES = {"block_m": 16, "block_n": 16}  # several tiles per sequence, cheap to interpret


def run_both(contexts: list[int], new: list[int], heads: int, kv_heads: int, head_dim: int,
             block_size: int, kv_cache_dtype: str = "auto", **pool_kwargs):
    q, k, v, starts = varlen_queries(new, heads, kv_heads, head_dim)
    pool = make_pool(
        contexts, kv_heads, head_dim, block_size, kv_cache_dtype=kv_cache_dtype, **pool_kwargs
    )
    context_lens = torch.tensor(contexts, dtype=torch.int32)
    args = (q, k, v, pool.k_cache, pool.v_cache, pool.block_tables, starts, context_lens,
            head_dim**-0.5, pool.k_scale, pool.v_scale)
    got = paged_prefill_attention_triton(*args, **SMALL_TILES)
    return got, paged_prefill_attention_reference(*args)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("block_size", [16, 32])
def test_prefill_matches_reference(block_size: int, group: int, head_dim: int) -> None:
    kv_heads = KV_HEADS_FOR_GROUP[group]
    # no context, a context that is not a block multiple, a long chunk after a full block
    contexts, new = [0, block_size + 5, block_size], [1, 7, 20]
    got, expected = run_both(contexts, new, kv_heads * group, kv_heads, head_dim, block_size)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8"])
def test_prefill_quantized_context_matches_reference(kv_cache_dtype: str) -> None:
    got, expected = run_both([21, 3], [5, 18], 6, 2, 64, 16, kv_cache_dtype)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_prefill_context_at_top_of_large_pool() -> None:
    got, expected = run_both(
        [40], [3], 2, 1, 64, 16, "int8", num_blocks=32768, top_of_pool=True
    )
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
