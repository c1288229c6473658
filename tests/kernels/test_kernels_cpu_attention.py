"""The compiled CPU paged-attention kernels against the torch references.

Inputs are bf16; the reference runs in float32 on the same (bf16-rounded) values. The kernel
rounds the softmax probabilities to bf16 for the P·V product and its output to bf16, so for
unit-variance inputs the max abs error is ~1e-2: the tolerance is atol = rtol = 2e-2.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from paged_kernel_inputs import make_pool, varlen_queries

from prefixcache.kernels.cpu import (
    cpu_attention_available,
    cpu_kernel_supports,
    paged_decode_attention_cpu,
    paged_prefill_attention_cpu,
)
from prefixcache.kernels.cpu.build import unavailable_reason
from prefixcache.kernels.reference.paged_attention import (
    paged_decode_attention_reference,
    paged_prefill_attention_reference,
)

if not cpu_attention_available():
    pytest.skip(
        f"CPU attention kernel unavailable: {unavailable_reason()}", allow_module_level=True
    )

TOLERANCE = {"atol": 2e-2, "rtol": 2e-2}
KV_HEADS_FOR_GROUP = {1: 2, 3: 3, 8: 1}


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)


def bf16_pool(lengths: list[int], kv_heads: int, head_dim: int, block_size: int, **kwargs):
    pool = make_pool(lengths, kv_heads, head_dim, block_size, **kwargs)
    return pool.k_cache.bfloat16(), pool.v_cache.bfloat16(), pool.block_tables


def fused_qkv(
    new: list[int], heads: int, kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Strided q [T, H, D], k and v [T, KV, D] views of one bf16 [T, H + 2 KV, D] tensor."""
    q, k, v, starts = varlen_queries(new, heads, kv_heads, head_dim)
    qkv = torch.cat([q, k, v], dim=1).bfloat16()  # [T, H + 2 KV, D]
    return qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :], starts


def as_float(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.float() for t in tensors]


def check_prefill(
    contexts: list[int],
    new: list[int],
    group: int,
    head_dim: int,
    block_size: int,
    scale: float | None = None,
    last_dim_strided: bool = False,
    **pool_kwargs,
) -> None:
    kv_heads = KV_HEADS_FOR_GROUP[group]
    heads = kv_heads * group
    q, k, v, starts = fused_qkv(new, heads, kv_heads, head_dim)
    if last_dim_strided:  # same values, head_dim no longer the contiguous axis
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    k_cache, v_cache, tables = bf16_pool(contexts, kv_heads, head_dim, block_size, **pool_kwargs)
    context_lens = torch.tensor(contexts, dtype=torch.int32)
    scale = head_dim**-0.5 if scale is None else scale
    got = paged_prefill_attention_cpu(
        q, k, v, k_cache, v_cache, tables, starts, context_lens, scale
    )
    expected = paged_prefill_attention_reference(
        *as_float(q, k, v, k_cache, v_cache), tables, starts, context_lens, scale
    )
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    torch.testing.assert_close(got.float(), expected, **TOLERANCE)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("block_size", [16, 32])
def test_prefill_matches_reference(
    block_size: int, group: int, head_dim: int, threads: int
) -> None:
    # one token without context; a context that is not a block multiple; a chunk after whole
    # blocks; a long chunk (several key blocks, causal diagonal) over an odd context
    contexts = [0, block_size + 5, 2 * block_size, 37]
    new = [1, 7, 20, 70]
    check_prefill(contexts, new, group, head_dim, block_size, num_blocks=64, top_of_pool=True)


def test_prefill_long_cold_sequence(threads: int) -> None:
    check_prefill([0], [200], 3, 64, 16)


def test_prefill_short_chunks_packed_per_item(threads: int) -> None:
    # at most 6 query rows per kv head: keys are packed inside the work item, not in a pre-pass
    check_prefill([30, 17, 0, 50], [2, 1, 2, 1], 3, 64, 16)


@pytest.mark.parametrize("head_dim", [32, 96])
def test_prefill_head_dim_not_multiple_of_64(head_dim: int) -> None:
    check_prefill([0, 40], [45, 30], 3, head_dim, 16)


def test_prefill_large_scores(threads: int) -> None:
    # scale 1: scores of std ~8, so the running max keeps rising and the softmax is peaked
    check_prefill([100, 0], [150, 90], 3, 64, 16, scale=1.0)


def test_prefill_last_dim_strided_q() -> None:
    check_prefill([20], [9], 1, 64, 16, last_dim_strided=True)


def test_prefill_zero_token_sequences(threads: int) -> None:
    check_prefill([5, 0, 40, 0], [0, 9, 0, 3], 3, 64, 16)


def test_prefill_empty_batch() -> None:
    k_cache, v_cache, tables = bf16_pool([], 1, 64, 16)
    q = torch.empty((0, 3, 64), dtype=torch.bfloat16)
    kv = torch.empty((0, 1, 64), dtype=torch.bfloat16)
    starts = torch.zeros(1, dtype=torch.int32)
    context_lens = torch.empty(0, dtype=torch.int32)
    out = paged_prefill_attention_cpu(
        q, kv, kv, k_cache, v_cache, tables, starts, context_lens, 0.125
    )
    assert out.shape == (0, 3, 64)


def check_decode(
    lengths: list[int], group: int, head_dim: int, block_size: int, **pool_kwargs
) -> None:
    kv_heads = KV_HEADS_FOR_GROUP[group]
    heads = kv_heads * group
    k_cache, v_cache, tables = bf16_pool(lengths, kv_heads, head_dim, block_size, **pool_kwargs)
    generator = torch.Generator().manual_seed(3)
    qkv = torch.randn((len(lengths), heads + 2, head_dim), generator=generator).bfloat16()
    q = qkv[:, :heads]  # [num_seqs, heads, head_dim], strided
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    scale = head_dim**-0.5
    got = paged_decode_attention_cpu(q, k_cache, v_cache, tables, seq_lens, scale)
    expected = paged_decode_attention_reference(
        *as_float(q, k_cache, v_cache), tables, seq_lens, scale
    )
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    torch.testing.assert_close(got.float(), expected, **TOLERANCE)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("block_size", [16, 32])
def test_decode_matches_reference(block_size: int, group: int, head_dim: int, threads: int) -> None:
    lengths = [1, block_size, block_size + 3, 150, 67]
    check_decode(lengths, group, head_dim, block_size, num_blocks=64, top_of_pool=True)


def test_decode_many_sequences(threads: int) -> None:
    # enough sequences for one work item per sequence covering all kv heads
    lengths = [1, 16, 19, 150, 67, 5, 33, 100, 2, 64, 300, 7]
    check_decode(lengths, 3, 64, 16)


def test_decode_zero_length_sequence_gives_zeros() -> None:
    k_cache, v_cache, tables = bf16_pool([20, 1], 1, 64, 16)
    q = torch.randn((2, 3, 64)).bfloat16()
    seq_lens = torch.tensor([20, 0], dtype=torch.int32)
    out = paged_decode_attention_cpu(q, k_cache, v_cache, tables, seq_lens, 0.125)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert out[0].abs().sum() > 0


def test_decode_empty_batch() -> None:
    k_cache, v_cache, tables = bf16_pool([], 3, 64, 16)
    q = torch.empty((0, 9, 64), dtype=torch.bfloat16)
    out = paged_decode_attention_cpu(
        q, k_cache, v_cache, tables, torch.empty(0, dtype=torch.int32), 0.125
    )
    assert out.shape == (0, 9, 64)


def test_bad_block_table_raises() -> None:
    k_cache, v_cache, tables = bf16_pool([40], 1, 64, 16, num_blocks=8)
    tables[0, 1] = 8  # one past the pool
    q = torch.zeros((1, 1, 64), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="outside"):
        paged_decode_attention_cpu(
            q, k_cache, v_cache, tables, torch.tensor([40], dtype=torch.int32), 0.125
        )


def test_supports_predicate() -> None:
    q = torch.zeros((2, 6, 64), dtype=torch.bfloat16)
    cache = torch.zeros((4, 16, 2, 64), dtype=torch.bfloat16)
    assert cpu_kernel_supports(q, cache, None)
    assert not cpu_kernel_supports(q.float(), cache, None)
    assert not cpu_kernel_supports(q, cache.to(torch.float8_e4m3fn), torch.ones(()))
    assert not cpu_kernel_supports(q, cache, torch.ones(()))
    assert not cpu_kernel_supports(q[..., :48], cache[..., :48], None)  # head_dim 48
    assert not cpu_kernel_supports(q[:, :5], cache, None)  # 5 heads over 2 kv heads


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXCACHE_CPU_KERNELS", "0")
    assert not cpu_attention_available()
    monkeypatch.delenv("PREFIXCACHE_CPU_KERNELS")
    assert cpu_attention_available()
