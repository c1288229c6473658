"""The compiled float32 (AVX2/FMA) paged-attention kernel against the torch reference, and its
exactness where the engine needs it: a token's output is bitwise the same whether it is
computed in one prefill, in a later chunk over its cached prefix, or as a decode step.

Both sides compute in float32 and sum in different orders: atol = rtol = 1e-5 for unit-variance
inputs (max abs error measured ~1e-6); scores of std ~8 carry 8x the rounding into the softmax,
so that test allows 1e-4 (measured 1.5e-5).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from paged_kernel_inputs import make_pool, varlen_queries

from prefixcache.kernels import paged_decode_attention, paged_prefill_attention
from prefixcache.kernels.cpu import (
    f32_attention_available,
    f32_kernel_supports,
    paged_decode_attention_f32,
    paged_prefill_attention_f32,
)
from prefixcache.kernels.cpu.build import F32_LIBRARY, kernels_enabled, unavailable_reason
from prefixcache.kernels.reference.kv_store import store_kv_reference
from prefixcache.kernels.reference.paged_attention import (
    paged_decode_attention_reference,
    paged_prefill_attention_reference,
)

if not f32_attention_available():
    pytest.skip(
        f"float32 CPU attention kernel unavailable: {unavailable_reason(F32_LIBRARY)}",
        allow_module_level=True,
    )

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
KV_HEADS_FOR_GROUP = {1: 2, 3: 3, 8: 1, 12: 1}


def check_prefill(
    contexts: list[int],
    new: list[int],
    group: int,
    head_dim: int,
    block_size: int,
    scale: float | None = None,
    strided: bool = False,
    tolerance: float = 1e-5,
    **pool_kwargs,
) -> None:
    kv_heads = KV_HEADS_FOR_GROUP[group]
    heads = kv_heads * group
    q, k, v, starts = varlen_queries(new, heads, kv_heads, head_dim)
    if strided:  # views of one fused [T, H + 2 KV, D] tensor, as the model's QKV split gives
        qkv = torch.cat([q, k, v], dim=1)
        q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
    pool = make_pool(contexts, kv_heads, head_dim, block_size, **pool_kwargs)
    context_lens = torch.tensor(contexts, dtype=torch.int32)
    scale = head_dim**-0.5 if scale is None else scale
    args = (pool.k_cache, pool.v_cache, pool.block_tables, starts, context_lens, scale)
    got = paged_prefill_attention_f32(q, k, v, *args)
    expected = paged_prefill_attention_reference(q, k, v, *args)
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("block_size", [16, 5])
def test_prefill_matches_reference(
    block_size: int, group: int, head_dim: int, threads: int
) -> None:
    # one token without context; a context that is not a block multiple; a chunk after whole
    # blocks; a long chunk (several key blocks, the causal diagonal) over an odd context
    contexts = [0, block_size + 5, 2 * block_size, 37]
    new = [1, 7, 20, 70]
    check_prefill(contexts, new, group, head_dim, block_size, num_blocks=64, top_of_pool=True)


def test_prefill_long_cold_sequence(threads: int) -> None:
    check_prefill([0], [200], 3, 64, 16, strided=True)


@pytest.mark.parametrize("head_dim", [8, 40, 256])
def test_prefill_other_head_dims(head_dim: int) -> None:
    check_prefill([0, 40], [45, 30], 3, head_dim, 16)


def test_prefill_group_wider_than_a_tile(threads: int) -> None:
    check_prefill([9, 0], [5, 3], 12, 64, 4)


def test_prefill_large_scores(threads: int) -> None:
    # scale 1: scores of std ~8, so the running max keeps rising and the softmax is peaked
    check_prefill([100, 0], [150, 90], 3, 64, 16, scale=1.0, tolerance=1e-4)


def test_prefill_zero_token_sequences(threads: int) -> None:
    check_prefill([5, 0, 40, 0], [0, 9, 0, 3], 3, 64, 16)


def check_decode(lengths: list[int], group: int, head_dim: int, block_size: int) -> None:
    kv_heads = KV_HEADS_FOR_GROUP[group]
    heads = kv_heads * group
    pool = make_pool(lengths, kv_heads, head_dim, block_size)
    generator = torch.Generator().manual_seed(3)
    qkv = torch.randn((len(lengths), heads + 2, head_dim), generator=generator)
    q = qkv[:, :heads]  # [num_seqs, heads, head_dim], strided
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    args = (pool.k_cache, pool.v_cache, pool.block_tables, seq_lens, head_dim**-0.5)
    got = paged_decode_attention_f32(q, *args)
    expected = paged_decode_attention_reference(q, *args)
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got, expected, **TOLERANCE)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8, 12])
def test_decode_matches_reference(group: int, head_dim: int, threads: int) -> None:
    check_decode([1, 16, 19, 150, 67, 5, 33, 300], group, head_dim, 16)


def test_decode_zero_length_sequence_gives_zeros() -> None:
    pool = make_pool([20, 1], 1, 64, 16)
    q = torch.randn((2, 3, 64))
    seq_lens = torch.tensor([20, 0], dtype=torch.int32)
    out = paged_decode_attention_f32(q, pool.k_cache, pool.v_cache, pool.block_tables,
                                     seq_lens, 0.125)  # fmt: skip
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert out[0].abs().sum() > 0


def test_empty_batches() -> None:
    pool = make_pool([], 3, 64, 16)
    q = torch.empty((0, 9, 64))
    kv = torch.empty((0, 3, 64))
    none = torch.empty(0, dtype=torch.int32)
    caches = (pool.k_cache, pool.v_cache, pool.block_tables)
    starts = torch.zeros(1, dtype=torch.int32)
    assert paged_prefill_attention_f32(q, kv, kv, *caches, starts, none, 0.1).shape == q.shape
    assert paged_decode_attention_f32(q, *caches, none, 0.1).shape == q.shape


@dataclass
class OneSequence:
    q: torch.Tensor  # [total, heads, head_dim]
    k: torch.Tensor  # [total, kv_heads, head_dim]
    v: torch.Tensor  # [total, kv_heads, head_dim]
    k_cache: torch.Tensor  # [blocks + 2, block_size, kv_heads, head_dim], zeros
    v_cache: torch.Tensor
    table: torch.Tensor  # [1, blocks] int32, shuffled ids
    slots: torch.Tensor  # [blocks * block_size] int64, the table's slots in order
    whole: torch.Tensor  # [total, heads, head_dim]: the sequence in one cold prefill


def one_sequence(total: int, heads: int, kv_heads: int, head_dim: int,
                 block_size: int) -> OneSequence:
    """A sequence of ``total`` random tokens, an empty pool with room for it at shuffled
    blocks, and its outputs from one prefill with nothing cached."""
    q, k, v, _ = varlen_queries([total], heads, kv_heads, head_dim)
    blocks = -(-total // block_size)
    shape = (blocks + 2, block_size, kv_heads, head_dim)
    k_cache, v_cache = torch.zeros(shape), torch.zeros(shape)
    table = torch.randperm(blocks + 2)[:blocks].to(torch.int32)[None]  # [1, blocks]
    slots = (table[0].long()[:, None] * block_size + torch.arange(block_size)).reshape(-1)
    whole = paged_prefill_attention_f32(
        q, k, v, k_cache, v_cache, table, torch.tensor([0, total], dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32), head_dim**-0.5,
    )  # fmt: skip
    return OneSequence(q, k, v, k_cache, v_cache, table, slots, whole)


def test_chunked_cached_and_decoded_tokens_are_bitwise_equal(threads: int) -> None:
    """One sequence of 90 tokens: attended in one prefill; in chunks of 1, 7, 41 and 41 tokens,
    each over the pool holding the earlier ones; and its last token as a decode step. Every
    token's output is the same bits in all three."""
    total, head_dim = 90, 64
    s = one_sequence(total, heads=9, kv_heads=3, head_dim=head_dim, block_size=16)
    q, k, v, k_cache, v_cache, table, slots = s.q, s.k, s.v, s.k_cache, s.v_cache, s.table, s.slots
    scale, whole = head_dim**-0.5, s.whole
    chunks, begin = [], 0
    for size in (1, 7, 41, 41):
        end = begin + size
        chunks.append(paged_prefill_attention_f32(
            q[begin:end], k[begin:end], v[begin:end], k_cache, v_cache, table,
            torch.tensor([0, size], dtype=torch.int32), torch.tensor([begin], dtype=torch.int32),
            scale,
        ))  # fmt: skip
        store_kv_reference(k[begin:end], v[begin:end], k_cache, v_cache, slots[begin:end])
        begin = end
    assert torch.equal(torch.cat(chunks), whole)
    decoded = paged_decode_attention_f32(
        q[-1:], k_cache, v_cache, table, torch.tensor([total], dtype=torch.int32), scale
    )
    assert torch.equal(decoded, whole[-1:])


def test_a_sequence_is_bitwise_the_same_alone_in_a_batch_and_on_any_threads() -> None:
    """Row tiles share each step's reads of keys and values within a work item, and how many an
    item takes depends on the thread count and on the batch (1 thread: 4 a item here, 4
    threads: 2, 8 threads: 1); a tile's arithmetic must not. 64 new tokens over 150 cached,
    9 heads over 3 kv heads (192 rows a kv head: 8 tiles), alone and after another sequence."""
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16
    q, k, v, starts = varlen_queries([40, 64], heads, kv_heads, head_dim)
    pool = make_pool([300, 150], kv_heads, head_dim, block_size)
    scale = head_dim**-0.5
    previous = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 4, 8):
            torch.set_num_threads(threads)
            batch = paged_prefill_attention_f32(
                q, k, v, pool.k_cache, pool.v_cache, pool.block_tables, starts,
                torch.tensor([300, 150], dtype=torch.int32), scale,
            )  # fmt: skip
            alone = paged_prefill_attention_f32(
                q[40:], k[40:], v[40:], pool.k_cache, pool.v_cache, pool.block_tables[1:],
                torch.tensor([0, 64], dtype=torch.int32), torch.tensor([150], dtype=torch.int32),
                scale,
            )  # fmt: skip
            results += [batch[40:], alone]
    finally:
        torch.set_num_threads(previous)
    for result in results[1:]:
        assert torch.equal(result, results[0])


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 7, 8])
@pytest.mark.parametrize("kv_heads", [2, 6])
@pytest.mark.parametrize("batch", ["one", "many"])
def test_decode_is_bitwise_the_prefill_row_for_every_group(
    group: int, head_dim: int, kv_heads: int, batch: str, threads: int
) -> None:
    """A decode step's rows (1-8 heads of one token, scored 1-3 rows at a time against keys
    transposed into the lanes) give the same bits as that token's row in a prefill (query
    rows in the lanes), at lengths on both sides of the 48-key softmax steps; with one
    sequence a work item is one kv head, with many it takes up to 4 of them."""
    total = 100
    s = one_sequence(total, kv_heads * group, kv_heads, head_dim, block_size=16)
    store_kv_reference(s.k, s.v, s.k_cache, s.v_cache, s.slots[:total])
    positions = [0, 1, 7, 46, 47, 48, 49, 95, 96, 99] if batch == "many" else [97]
    decoded = paged_decode_attention_f32(
        s.q[positions], s.k_cache, s.v_cache, s.table.expand(len(positions), -1),
        torch.tensor(positions, dtype=torch.int32) + 1, head_dim**-0.5,
    )  # fmt: skip
    assert torch.equal(decoded, s.whole[positions])


def test_bad_inputs_raise() -> None:
    pool = make_pool([40], 1, 64, 16, num_blocks=8)
    q = torch.zeros((1, 1, 64))
    lens = torch.tensor([40], dtype=torch.int32)
    tables = pool.block_tables.clone()
    tables[0, 1] = 8  # one past the pool
    with pytest.raises(ValueError, match="outside"):
        paged_decode_attention_f32(q, pool.k_cache, pool.v_cache, tables, lens, 0.125)
    with pytest.raises(ValueError, match="fewer columns"):
        paged_decode_attention_f32(
            q, pool.k_cache, pool.v_cache, pool.block_tables[:, :1], lens, 0.125
        )
    with pytest.raises(ValueError, match="non-negative"):
        paged_decode_attention_f32(
            q, pool.k_cache, pool.v_cache, pool.block_tables, -lens, 0.125
        )
    with pytest.raises(ValueError, match="non-decreasing"):
        paged_prefill_attention_f32(
            q, q, q, pool.k_cache, pool.v_cache, pool.block_tables,
            torch.tensor([1, 0], dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 0.125,
        )  # fmt: skip
    with pytest.raises(ValueError, match="no k/v scales"):
        paged_decode_attention_f32(
            q, pool.k_cache, pool.v_cache, pool.block_tables, lens, 0.125, torch.ones(())
        )
    with pytest.raises(ValueError, match="float32"):
        paged_decode_attention_f32(
            q, pool.k_cache.bfloat16(), pool.v_cache.bfloat16(), pool.block_tables, lens, 0.1
        )


def test_supports_predicate() -> None:
    q = torch.zeros((2, 6, 64))
    cache = torch.zeros((4, 16, 2, 64))
    assert f32_kernel_supports(q, cache, None)
    assert not f32_kernel_supports(q, cache, torch.ones(()))  # float32 pools take no scale
    assert not f32_kernel_supports(q.bfloat16(), cache, None)
    assert not f32_kernel_supports(q, cache.bfloat16(), None)
    assert not f32_kernel_supports(q[..., :60], cache[..., :60], None)  # head_dim 60
    assert not f32_kernel_supports(q[:, :5], cache, None)  # 5 heads over 2 kv heads
    assert not f32_kernel_supports(q, cache.transpose(0, 1), None)  # not contiguous


def test_dispatch_picks_the_kernel_for_float32_cpu_tensors(monkeypatch) -> None:
    """The engine's entry points route float32 CPU attention here (the kernel's results equal
    the dispatched ones bitwise)."""
    pool = make_pool([30], 3, 64, 16)
    q, k, v, starts = varlen_queries([5], 9, 3, 64)
    args = (pool.k_cache, pool.v_cache, pool.block_tables)
    context = torch.tensor([30], dtype=torch.int32)
    assert torch.equal(
        paged_prefill_attention(q, k, v, *args, starts, context, 0.125),
        paged_prefill_attention_f32(q, k, v, *args, starts, context, 0.125),
    )
    assert torch.equal(
        paged_decode_attention(q[:1], *args, context, 0.125),
        paged_decode_attention_f32(q[:1], *args, context, 0.125),
    )


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXCACHE_CPU_KERNELS", "0")
    kernels_enabled.cache_clear()  # the variable is read once, at first use
    try:
        assert not f32_attention_available()
        assert not f32_kernel_supports(torch.zeros((1, 1, 64)), torch.zeros((1, 4, 1, 64)), None)
        assert unavailable_reason(F32_LIBRARY) == "disabled by PREFIXCACHE_CPU_KERNELS=0"
    finally:
        monkeypatch.delenv("PREFIXCACHE_CPU_KERNELS")
        kernels_enabled.cache_clear()
    assert f32_attention_available()
