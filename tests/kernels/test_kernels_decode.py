"""Triton split-K paged decode attention (interpreted) against the torch reference."""

from __future__ import annotations

import pytest
import torch
from paged_kernel_inputs import make_pool

from prefixcache.kernels.reference.paged_attention import paged_decode_attention_reference
from prefixcache.kernels.triton import paged_decode_attention_triton

KV_HEADS_FOR_GROUP = {1: 2, 3: 2, 8: 1}  # GQA ratio -> KV heads (kept small for the interpreter)


def run_both(pool, q: torch.Tensor, lengths: list[int], **triton_kwargs):
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    args = (q, pool.k_cache, pool.v_cache, pool.block_tables, seq_lens, q.shape[-1] ** -0.5)
    scales = (pool.k_scale, pool.v_scale)
    expected = paged_decode_attention_reference(*args, *scales)
    got = paged_decode_attention_triton(*args, *scales, **triton_kwargs)
    return got, expected


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("block_size", [16, 32])
def test_decode_matches_reference(block_size: int, group: int, head_dim: int) -> None:
    kv_heads = KV_HEADS_FOR_GROUP[group]
    lengths = [1, 2 * block_size + 3, block_size]  # one token, a non-multiple, a full block
    pool = make_pool(lengths, kv_heads, head_dim, block_size, num_blocks=64)
    q = torch.randn(len(lengths), kv_heads * group, head_dim)
    # 3 splits: the long sequence is merged across splits, the 1-token one has empty splits
    got, expected = run_both(pool, q, lengths, num_splits=3, block_n=16)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8"])
def test_decode_quantized_matches_reference(kv_cache_dtype: str) -> None:
    lengths = [5, 37]
    pool = make_pool(lengths, 2, 64, 16, kv_cache_dtype=kv_cache_dtype)
    q = torch.randn(2, 6, 64)
    got, expected = run_both(pool, q, lengths, num_splits=2, block_n=16)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_decode_block_ids_at_top_of_large_pool() -> None:
    # int8 keeps a 32768-block pool small; every page of the sequences is among the top ids
    lengths = [50, 3]
    pool = make_pool(lengths, 1, 64, 16, num_blocks=32768, kv_cache_dtype="int8", top_of_pool=True)
    used = torch.cat([pool.block_tables[0, :4], pool.block_tables[1, :1]])
    assert int(used.min()) >= 32768 - 5
    q = torch.randn(2, 3, 64)
    got, expected = run_both(pool, q, lengths)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_decode_block_size_8_and_default_splits() -> None:
    lengths = [19, 8]
    pool = make_pool(lengths, 2, 64, 8)
    q = torch.randn(2, 4, 64)
    got, expected = run_both(pool, q, lengths)  # default split and tile choice
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_decode_reads_strided_query_and_bf16() -> None:
    lengths = [21]
    pool = make_pool(lengths, 2, 64, 16)
    pool.k_cache, pool.v_cache = pool.k_cache.bfloat16(), pool.v_cache.bfloat16()
    fused = torch.randn(1, 6 * 64 + 32).bfloat16()  # q as a strided view of a wider projection
    q = fused[:, : 6 * 64].view(1, 6, 64)
    got, expected = run_both(pool, q, lengths, num_splits=2)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_decode_128k_token_sequence() -> None:
    length = 128 * 1024  # int8 pool of 8,200 blocks: 8 MiB per K/V
    pool = make_pool([length], 1, 64, 16, num_blocks=length // 16 + 8, kv_cache_dtype="int8")
    q = torch.randn(1, 2, 64)
    got, expected = run_both(pool, q, [length], block_n=256)  # default split count
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
