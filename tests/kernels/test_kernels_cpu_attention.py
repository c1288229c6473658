"""The compiled CPU paged-attention kernels against the torch references.

Inputs are bf16; the reference runs in float32 on the same (bf16-rounded) values. The kernel
rounds the softmax probabilities to bf16 for the P·V product and its output to bf16, so for
unit-variance inputs the max abs error is ~1e-2: the tolerance is atol = rtol = 2e-2.

Quantized (int8 / fp8 e4m3fn) pools are filled by the reference store with per-channel,
per-head or scalar scales, and both sides read the same stored bytes: the reference
dequantizes them to float32, the kernel to bf16 (as ``dequantize(..., torch.bfloat16)``), one
more bf16 rounding of K and V, so the same tolerance applies (max abs error measured 9e-3,
a quarter of it). That the kernel's bf16 values are exactly ``dequantize(..., bfloat16)`` is
checked separately, bit for bit, through a one-token decode.
"""

from __future__ import annotations

import pytest
import torch
from paged_kernel_inputs import make_pool, varlen_queries

from prefixcache.kernels.cpu import (
    cpu_attention_available,
    cpu_kernel_supports,
    cpu_model_ops_support,
    paged_decode_attention_cpu,
    paged_prefill_attention_cpu,
)
from prefixcache.kernels.cpu.build import kernels_enabled, unavailable_reason
from prefixcache.kernels.quantization import FP8_DTYPE, dequantize
from prefixcache.kernels.reference.kv_store import store_kv_reference
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
QUANTIZED = {"int8": torch.int8, "fp8": FP8_DTYPE}
SCALE_SHAPES = ["channel", "head", "scalar"]  # [kv_heads, head_dim], [kv_heads], []


def bf16_pool(lengths: list[int], kv_heads: int, head_dim: int, block_size: int, **kwargs):
    pool = make_pool(lengths, kv_heads, head_dim, block_size, **kwargs)
    return pool.k_cache.bfloat16(), pool.v_cache.bfloat16(), pool.block_tables


def coarser_scale(
    scale: torch.Tensor,  # [kv_heads, head_dim] float32
    scale_shape: str,
) -> torch.Tensor:  # [kv_heads, head_dim], [kv_heads] or [], never below ``scale``
    if scale_shape == "channel":
        return scale
    return scale.amax(1) if scale_shape == "head" else scale.amax()


def quantized_pool(
    lengths: list[int],
    kv_heads: int,
    head_dim: int,
    block_size: int,
    kv_cache_dtype: str,
    scale_shape: str,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """An int8 / fp8 pool of random tokens with scales of ``scale_shape``: k_cache, v_cache
    [num_blocks, block_size, kv_heads, head_dim], block_tables [num_seqs, max_blocks] int32,
    k_scale, v_scale. The per-channel pool of ``make_pool`` is read back and stored again by
    the reference store with the coarser scales (never below the per-channel ones)."""
    pool = make_pool(
        lengths, kv_heads, head_dim, block_size, kv_cache_dtype=kv_cache_dtype, **kwargs
    )
    k_scale = coarser_scale(pool.k_scale, scale_shape)
    v_scale = coarser_scale(pool.v_scale, scale_shape)
    shape = (-1, kv_heads, head_dim)  # [slots, kv_heads, head_dim]
    k = dequantize(pool.k_cache, pool.k_scale, torch.float32).reshape(shape)
    v = dequantize(pool.v_cache, pool.v_scale, torch.float32).reshape(shape)
    k_cache, v_cache = torch.empty_like(pool.k_cache), torch.empty_like(pool.v_cache)
    slots = torch.arange(k.shape[0])
    store_kv_reference(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    return k_cache, v_cache, pool.block_tables, k_scale, v_scale


def kernel_and_reference_pools(
    lengths: list[int],
    kv_heads: int,
    head_dim: int,
    block_size: int,
    kv_cache_dtype: str,
    scale_shape: str,
    **kwargs,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], tuple]:
    """(k_cache, v_cache, block_tables) for the kernel, the same for the float32 reference
    (a bf16 pool as float32, a quantized one as stored), and the (k_scale, v_scale) both take
    ((None, None) for bf16)."""
    if kv_cache_dtype == "auto":
        k_cache, v_cache, tables = bf16_pool(lengths, kv_heads, head_dim, block_size, **kwargs)
        return (k_cache, v_cache, tables), (*as_float(k_cache, v_cache), tables), (None, None)
    *pool, k_scale, v_scale = quantized_pool(
        lengths, kv_heads, head_dim, block_size, kv_cache_dtype, scale_shape, **kwargs
    )
    return tuple(pool), tuple(pool), (k_scale, v_scale)


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
    kv_cache_dtype: str = "auto",
    scale_shape: str = "channel",
    **pool_kwargs,
) -> None:
    kv_heads = KV_HEADS_FOR_GROUP[group]
    heads = kv_heads * group
    q, k, v, starts = fused_qkv(new, heads, kv_heads, head_dim)
    if last_dim_strided:  # same values, head_dim no longer the contiguous axis
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    pool, ref_pool, kv_scales = kernel_and_reference_pools(
        contexts, kv_heads, head_dim, block_size, kv_cache_dtype, scale_shape, **pool_kwargs
    )
    context_lens = torch.tensor(contexts, dtype=torch.int32)
    scale = head_dim**-0.5 if scale is None else scale
    got = paged_prefill_attention_cpu(q, k, v, *pool, starts, context_lens, scale, *kv_scales)
    expected = paged_prefill_attention_reference(
        *as_float(q, k, v), *ref_pool, starts, context_lens, scale, *kv_scales
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
    # at most 6 query rows per kv head: every work item packs its keys for itself
    check_prefill([30, 17, 0, 50], [2, 1, 2, 1], 3, 64, 16)


def attend_in_two_chunks(total: int, cached: int, seed: int) -> tuple[torch.Tensor, ...]:
    """SmolLM2's heads (9 / 3, dim 64): a sequence's last ``total - cached`` outputs computed
    with every token new, and with the first ``cached`` tokens' K/V in the pool (a prefix
    hit). Query scales spread over two orders of magnitude and keys growing along the
    sequence, so rows see their running max rise at different key blocks."""
    heads, kv_heads, dim, bs = 9, 3, 64, 16
    g = torch.Generator().manual_seed(seed)
    spread = torch.logspace(-1, 1, total)[torch.randperm(total, generator=g)]
    q = (torch.randn(total, heads, dim, generator=g) * spread[:, None, None]).bfloat16()
    growth = torch.linspace(0.2, 3.0, total)[:, None, None]
    k = (torch.randn(total, kv_heads, dim, generator=g) * growth).bfloat16()
    v = torch.randn(total, kv_heads, dim, generator=g).bfloat16()
    blocks = total // bs + 2
    k_cache = torch.zeros(blocks, bs, kv_heads, dim, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    table = torch.arange(blocks, dtype=torch.int32)[None]

    def attend(start: int) -> torch.Tensor:
        return paged_prefill_attention_cpu(
            q[start:].contiguous(), k[start:].contiguous(), v[start:].contiguous(), k_cache,
            v_cache, table, torch.tensor([0, total - start], dtype=torch.int32),
            torch.tensor([start], dtype=torch.int32), dim**-0.5,
        )  # fmt: skip

    everything = attend(0)
    k_cache.view(-1, kv_heads, dim)[:cached] = k[:cached]
    v_cache.view(-1, kv_heads, dim)[:cached] = v[:cached]
    return everything[cached:], attend(cached)


@pytest.mark.parametrize("cached", [1, 7, 35, 99])
@pytest.mark.parametrize("new", [3, 33, 150])
def test_prefill_token_results_do_not_depend_on_chunking(cached: int, new: int,
                                                         threads: int) -> None:  # fmt: skip
    """Bitwise: a token's output is the same whether its prompt ran in one chunk or after a
    cached prefix (which rows share its register tile changes). A tile once raised every
    row's softmax reference max when one row's scores passed its threshold: the rounding of a
    row's probabilities depended on its neighbours, and a cached answer on 2 cores differed
    from the uncached one by 0.75 in a logit of SmolLM2."""
    whole, after_hit = attend_in_two_chunks(cached + new, cached, seed=cached * 1000 + new)
    assert torch.equal(whole, after_hit)


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
    lengths: list[int],
    group: int,
    head_dim: int,
    block_size: int,
    kv_cache_dtype: str = "auto",
    scale_shape: str = "channel",
    scale: float | None = None,
    **pool_kwargs,
) -> None:
    kv_heads = KV_HEADS_FOR_GROUP[group]
    heads = kv_heads * group
    pool, ref_pool, kv_scales = kernel_and_reference_pools(
        lengths, kv_heads, head_dim, block_size, kv_cache_dtype, scale_shape, **pool_kwargs
    )
    generator = torch.Generator().manual_seed(3)
    qkv = torch.randn((len(lengths), heads + 2, head_dim), generator=generator).bfloat16()
    q = qkv[:, :heads]  # [num_seqs, heads, head_dim], strided
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    scale = head_dim**-0.5 if scale is None else scale
    got = paged_decode_attention_cpu(q, *pool, seq_lens, scale, *kv_scales)
    expected = paged_decode_attention_reference(q.float(), *ref_pool, seq_lens, scale, *kv_scales)
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


@pytest.mark.parametrize(
    ("lengths", "group", "head_dim"),
    [
        ([2000], 3, 64),  # one sequence: its 3 kv heads' keys in 6 chunks each
        ([1300, 700, 40], 3, 64),  # 2, 2 and 1 (unsplit) chunks
        ([1200, 30], 8, 128),
        ([1100], 1, 32),
    ],
)
def test_decode_split_keys_over_few_sequences(
    lengths: list[int], group: int, head_dim: int, threads: int
) -> None:
    """Few long sequences on 2 threads: keys split into chunks whose partial outputs are
    merged (on 1 thread, unsplit)."""
    check_decode(lengths, group, head_dim, 16)


def test_decode_split_keys_large_scores(threads: int) -> None:
    # scale 1: peaked softmax, the chunks' maxima differ widely before the merge
    check_decode([1500, 900], 3, 64, 16, scale=1.0)


def test_prefill_split_keys_short_chunks(threads: int) -> None:
    # 1-2 new tokens over long contexts (packed per item): split as decode, causal new keys
    # in the last chunk
    check_prefill([900, 1000, 5], [1, 2, 1], 3, 64, 16)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_quantized_decode_split_keys(kv_cache_dtype: str, threads: int) -> None:
    check_decode([1500, 600], 3, 64, 16, kv_cache_dtype=kv_cache_dtype)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("scale_shape", SCALE_SHAPES)
@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_quantized_prefill_matches_reference(
    kv_cache_dtype: str, scale_shape: str, block_size: int, group: int, head_dim: int
) -> None:
    # as test_prefill_matches_reference: per-tile packing (1 token) and packing kept per thread,
    # contexts that end inside a block, a long chunk whose keys are part pool, part new k/v
    contexts = [0, block_size + 5, 2 * block_size, 37]
    new = [1, 7, 20, 70]
    check_prefill(
        contexts, new, group, head_dim, block_size, kv_cache_dtype=kv_cache_dtype,
        scale_shape=scale_shape, num_blocks=64, top_of_pool=True,
    )  # fmt: skip


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("scale_shape", SCALE_SHAPES)
@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_quantized_decode_matches_reference(
    kv_cache_dtype: str, scale_shape: str, block_size: int, group: int, head_dim: int
) -> None:
    lengths = [1, block_size, block_size + 3, 150, 67]
    check_decode(
        lengths, group, head_dim, block_size, kv_cache_dtype=kv_cache_dtype,
        scale_shape=scale_shape, num_blocks=64, top_of_pool=True,
    )  # fmt: skip


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_quantized_decode_many_sequences(kv_cache_dtype: str, threads: int) -> None:
    lengths = [1, 16, 19, 150, 67, 5, 33, 100, 2, 64, 300, 7]
    check_decode(lengths, 3, 64, 16, kv_cache_dtype=kv_cache_dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_quantized_prefill_threads(kv_cache_dtype: str, threads: int) -> None:
    # short chunks packed per item, then long ones whose packed keys each thread keeps
    check_prefill([30, 17, 0, 50], [2, 1, 2, 1], 3, 64, 16, kv_cache_dtype=kv_cache_dtype)
    check_prefill([100, 0], [150, 90], 3, 64, 16, kv_cache_dtype=kv_cache_dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_quantized_values_are_read_exactly(kv_cache_dtype: str) -> None:
    """Over one cached token the softmax puts all the weight on it (1 up to float32 rounding,
    far below bf16's), so decode returns that token's value row, which must be
    dequantize(stored, v_scale, bfloat16) bit for bit: here for every byte pattern (int8
    -128..127; fp8 zeros, subnormals, normals up to +-448, NaNs)."""
    dtype = QUANTIZED[kv_cache_dtype]
    raw = torch.zeros((2, 16, 2, 128), dtype=torch.uint8)  # [blocks, block_size, kv, dim]
    raw[1, 0] = torch.arange(256, dtype=torch.uint8).reshape(2, 128)
    k_cache, v_cache = torch.zeros_like(raw).view(dtype), raw.view(dtype)
    generator = torch.Generator().manual_seed(5)
    k_scale, v_scale = torch.rand((2, 2, 128), generator=generator) * 0.1 + 1e-3
    q = torch.randn((1, 6, 128), generator=generator).bfloat16()  # group 3
    tables, seq_lens = torch.tensor([[1]], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    out = paged_decode_attention_cpu(q, k_cache, v_cache, tables, seq_lens, 0.1, k_scale, v_scale)
    expected = dequantize(v_cache[1, 0], v_scale, torch.bfloat16)  # [kv_heads, head_dim]
    expected = expected.repeat_interleave(3, dim=0)  # query head h reads kv head h // 3
    assert bool(expected.isnan().any()) == (kv_cache_dtype == "fp8")
    torch.testing.assert_close(out[0], expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_quantized_pool_without_scales_is_rejected(kv_cache_dtype: str) -> None:
    k_cache, v_cache, tables, k_scale, v_scale = quantized_pool(
        [20], 1, 64, 16, kv_cache_dtype, "channel", num_blocks=8
    )
    q = torch.zeros((1, 3, 64), dtype=torch.bfloat16)
    kv = torch.zeros((1, 1, 64), dtype=torch.bfloat16)
    starts, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([20], dtype=torch.int32)
    for scales in [(None, None), (k_scale, None), (None, v_scale)]:
        with pytest.raises(ValueError, match="needs k_scale and v_scale"):
            paged_decode_attention_cpu(q, k_cache, v_cache, tables, lens, 0.125, *scales)
        with pytest.raises(ValueError, match="needs k_scale and v_scale"):
            paged_prefill_attention_cpu(
                q, kv, kv, k_cache, v_cache, tables, starts, lens, 0.125, *scales
            )
    with pytest.raises(ValueError, match="v_scale has shape"):  # [head_dim]: not a scale shape
        paged_decode_attention_cpu(q, k_cache, v_cache, tables, lens, 0.125, k_scale, v_scale[0])


def test_bf16_pool_with_scales_is_rejected() -> None:
    k_cache, v_cache, tables = bf16_pool([20], 1, 64, 16, num_blocks=8)
    q = torch.zeros((1, 3, 64), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="takes no"):
        paged_decode_attention_cpu(
            q, k_cache, v_cache, tables, torch.tensor([20], dtype=torch.int32), 0.125,
            torch.ones(()), torch.ones(()),
        )  # fmt: skip


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


SUPPORTED = [  # (q dtype, pool dtype, scale shape or None, supported) for 2 kv heads of 64
    (torch.bfloat16, torch.bfloat16, None, True),
    (torch.bfloat16, torch.bfloat16, (), False),  # a bf16 pool takes no scale
    (torch.bfloat16, torch.int8, (2, 64), True),
    (torch.bfloat16, torch.int8, (2,), True),
    (torch.bfloat16, torch.int8, (), True),
    (torch.bfloat16, torch.int8, None, False),  # a quantized pool needs one
    (torch.bfloat16, torch.int8, (64,), False),  # [head_dim]: not a scale shape
    (torch.bfloat16, FP8_DTYPE, (2, 64), True),
    (torch.bfloat16, FP8_DTYPE, (2,), True),
    (torch.bfloat16, FP8_DTYPE, (), True),
    (torch.bfloat16, FP8_DTYPE, None, False),
    (torch.float32, torch.int8, (2, 64), False),  # queries must be bf16
    (torch.float32, FP8_DTYPE, (), False),
    (torch.float32, torch.bfloat16, None, False),
    (torch.float32, torch.float32, None, False),
    (torch.bfloat16, torch.float16, None, False),
    (torch.bfloat16, torch.float32, None, False),
    (torch.bfloat16, torch.float8_e5m2, (2, 64), False),
    (torch.bfloat16, torch.uint8, (2, 64), False),
]


@pytest.mark.parametrize(("q_dtype", "pool_dtype", "scale_shape", "supported"), SUPPORTED)
def test_supports_truth_table(
    q_dtype: torch.dtype, pool_dtype: torch.dtype, scale_shape: tuple | None, supported: bool
) -> None:
    q = torch.zeros((2, 6, 64), dtype=q_dtype)
    cache = torch.zeros((4, 16, 2, 64)).to(pool_dtype)
    scale = None if scale_shape is None else torch.ones(scale_shape)
    assert cpu_kernel_supports(q, cache, scale) is supported


@pytest.mark.parametrize("pool_dtype", [torch.bfloat16, torch.int8, FP8_DTYPE])
def test_supports_predicate_shapes(pool_dtype: torch.dtype) -> None:
    q = torch.zeros((2, 6, 64), dtype=torch.bfloat16)
    cache = torch.zeros((4, 16, 2, 64)).to(pool_dtype)
    scale = None if pool_dtype is torch.bfloat16 else torch.ones((2, 64))
    narrow = None if scale is None else scale[:, :48]
    assert cpu_kernel_supports(q, cache, scale)
    assert not cpu_kernel_supports(q[..., :48], cache[..., :48], narrow)  # head_dim 48
    assert not cpu_kernel_supports(q[:, :5], cache, scale)  # 5 heads over 2 kv heads
    assert not cpu_kernel_supports(q, cache.transpose(0, 1), scale)  # not contiguous


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXCACHE_CPU_KERNELS", "0")
    kernels_enabled.cache_clear()  # the variable is read once, at first use
    try:
        assert not cpu_attention_available()
        assert not cpu_model_ops_support(torch.zeros(1, dtype=torch.bfloat16))
        assert unavailable_reason() == "disabled by PREFIXCACHE_CPU_KERNELS=0"
    finally:
        monkeypatch.delenv("PREFIXCACHE_CPU_KERNELS")
        kernels_enabled.cache_clear()
    assert cpu_attention_available()
