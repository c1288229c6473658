"""Triton KV store (plain and quantized) and block copy (interpreted) against the references."""

from __future__ import annotations

import pytest
import torch

from prefixcache.kernels import block_copier
from prefixcache.kernels.dispatch import cpu_kernels
from prefixcache.kernels.quantization import kv_storage_dtype, scales_from_amax
from prefixcache.kernels.reference.kv_store import copy_blocks_reference, store_kv_reference
from prefixcache.kernels.triton import copy_blocks_triton, store_kv_triton

NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM = 12, 16, 3, 64


def empty_pool(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def raw(t: torch.Tensor) -> torch.Tensor:
    """Stored bytes, so fp8 NaN patterns or -0.0 cannot hide a difference."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int8"])
def test_store_writes_same_bytes_as_reference(kv_cache_dtype: str) -> None:
    dtype = kv_storage_dtype(kv_cache_dtype, torch.float32)
    fused = torch.randn(9, 2, KV_HEADS, HEAD_DIM + 8) * 3  # k, v as strided views
    k, v = fused[:, 0, :, :HEAD_DIM], fused[:, 1, :, :HEAD_DIM]
    k[0, 0, :4] = torch.tensor([1e6, -1e6, 0.5, -0.5])  # saturation and int8 rounding ties
    slots = torch.tensor([0, 5, -1, 17, 191, 100, -1, 63, 64], dtype=torch.int64)
    k_scale = v_scale = None
    if kv_cache_dtype != "auto":
        k_scale = scales_from_amax(torch.full((KV_HEADS, HEAD_DIM), 6.0), dtype, 1.0)
        v_scale = torch.full((KV_HEADS,), 0.05)  # per-head scales broadcast over channels
        k_scale[0, :4] = 1.0
    expected_k, expected_v = empty_pool(dtype)
    got_k, got_v = empty_pool(dtype)
    store_kv_reference(k, v, expected_k, expected_v, slots, k_scale, v_scale)
    store_kv_triton(k, v, got_k, got_v, slots, k_scale, v_scale)
    assert torch.equal(raw(got_k), raw(expected_k))
    assert torch.equal(raw(got_v), raw(expected_v))
    written = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    untouched = got_k.view(-1, KV_HEADS, HEAD_DIM)[~written]
    assert not raw(untouched).any()  # slot -1 tokens wrote nothing
    if kv_cache_dtype == "int8":
        assert got_k[0, 0, 0, :4].tolist() == [127, -127, 1, 0]  # clamp, floor(x + 0.5)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int8"])
def test_copy_blocks_matches_reference(kv_cache_dtype: str) -> None:
    dtype = kv_storage_dtype(kv_cache_dtype, torch.bfloat16)
    source = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM).to(dtype)
    pairs = torch.tensor([[0, 7], [3, 8], [0, 11]], dtype=torch.int64)
    expected_k, expected_v = source[0].clone(), source[1].clone()
    got_k, got_v = source[0].clone(), source[1].clone()
    copy_blocks_reference(expected_k, expected_v, pairs)
    copy_blocks_triton(got_k, got_v, pairs)
    assert torch.equal(raw(got_k), raw(expected_k)) and torch.equal(raw(got_v), raw(expected_v))
    assert torch.equal(raw(got_k[11]), raw(source[0, 0]))


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int8"])
def test_copy_blocks_reference_reads_every_source_first(kv_cache_dtype: str) -> None:
    """A destination among the sources gets copied from, then over (one gather); a few
    disjoint pairs copied one by one equal the same pairs in one gather."""
    dtype = kv_storage_dtype(kv_cache_dtype, torch.bfloat16)
    source = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM).to(dtype)
    k, v = source[0].clone(), source[1].clone()
    copy_blocks_reference(k, v, torch.tensor([[1, 2], [2, 3]]))
    assert torch.equal(raw(k[2]), raw(source[0, 1])) and torch.equal(raw(k[3]), raw(source[0, 2]))
    assert torch.equal(raw(v[3]), raw(source[1, 2]))
    many = torch.tensor([[i % 3, 3 + i] for i in range(9)])  # past the one-by-one limit
    one_by_one = [source[i].clone() for i in range(2)]
    gathered = [source[i].clone() for i in range(2)]
    for start in range(0, 9, 3):
        copy_blocks_reference(*one_by_one, many[start : start + 3])
    copy_blocks_reference(*gathered, many)
    assert all(torch.equal(raw(a), raw(b)) for a, b in zip(one_by_one, gathered, strict=True))
    assert torch.equal(raw(gathered[0][11]), raw(source[0, 2]))


def test_empty_inputs_are_no_ops() -> None:
    k_cache, v_cache = empty_pool(torch.float32)
    none = torch.zeros(0, KV_HEADS, HEAD_DIM)
    store_kv_triton(none, none, k_cache, v_cache, torch.zeros(0, dtype=torch.int64))
    copy_blocks_triton(k_cache, v_cache, torch.zeros(0, 2, dtype=torch.int64))
    assert not k_cache.any() and not v_cache.any()


def test_fp8_store_rounds_like_torch_on_every_value_and_midpoint() -> None:
    finite = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    finite = finite[torch.isfinite(finite)].unique()  # every e4m3 value, both signs
    midpoints = (finite[1:] + finite[:-1]) / 2  # exact ties: round to even
    generator = torch.Generator().manual_seed(0)
    tiny = (torch.rand(1000, generator=generator) - 0.5) * 0.03  # subnormal range, -0.0 results
    values = torch.cat([finite, midpoints, finite * 1.03, tiny])
    values = values[: values.numel() // HEAD_DIM * HEAD_DIM].view(-1, 1, HEAD_DIM)
    slots = torch.arange(values.shape[0])
    shape = (values.shape[0], 1, 1, HEAD_DIM)
    pools = [torch.zeros(shape, dtype=torch.float8_e4m3fn) for _ in range(4)]
    store_kv_reference(values, values, pools[0], pools[1], slots)
    store_kv_triton(values, values, pools[2], pools[3], slots)
    assert torch.equal(raw(pools[2]), raw(pools[0]))


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "int8"])
def test_block_copier_copies_every_pool_like_the_reference(kv_cache_dtype: str) -> None:
    """All layers' pools in one call (compiled on CPU where it runs) equal the reference per
    layer; a destination among the sources or a block outside the pools is refused with
    nothing copied."""
    dtype = kv_storage_dtype(kv_cache_dtype, torch.bfloat16)
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    layers = [torch.randn(shape).to(dtype) for _ in range(3)]
    pairs = torch.tensor([[0, 7], [3, 8], [0, 11]], dtype=torch.int64)
    expected = [layer.clone() for layer in layers]
    for layer in expected:
        copy_blocks_reference(layer[0], layer[1], pairs)
    got = [layer.clone() for layer in layers]
    block_copier([g[0] for g in got], [g[1] for g in got])(pairs)
    assert all(torch.equal(raw(a), raw(b)) for a, b in zip(got, expected, strict=True))
    if cpu_kernels().cpu_attention_available():
        pools = [g[0] for g in got]
        before = [raw(pool).clone() for pool in pools]
        for bad in ([[1, 2], [2, 3]], [[0, NUM_BLOCKS]], [[-1, 4]]):
            with pytest.raises(ValueError):
                cpu_kernels().copy_blocks_cpu(pools, torch.tensor(bad))
        assert all(torch.equal(raw(p), b) for p, b in zip(pools, before, strict=True))


@pytest.mark.skipif(
    not cpu_kernels().cpu_attention_available(), reason="needs the compiled CPU kernels"
)
def test_block_copier_copies_the_leading_token_slots_asked_for() -> None:
    """With token counts, each pair copies only its block's first that many slots (all for
    None, none for 0) and leaves the rest of the destination as it was; a count outside
    [0, block_size] or one count per pair missing is refused with nothing copied."""
    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    pools = [torch.randn(shape).to(torch.bfloat16) for _ in range(4)]
    before = [pool.clone() for pool in pools]
    copier = cpu_kernels().BlockCopier(pools)
    copier(torch.tensor([[0, 7], [3, 8], [5, 9]]), [5, None, 0])
    for pool, old in zip(pools, before, strict=True):
        expected = old.clone()
        expected[7, :5] = old[0, :5]
        expected[8] = old[3]
        assert torch.equal(pool, expected)
    copied = [pool.clone() for pool in pools]
    for bad in ([BLOCK_SIZE + 1], [-1], [2, 2]):
        with pytest.raises(ValueError):
            copier(torch.tensor([[1, 10]]), bad)
    assert all(torch.equal(p, c) for p, c in zip(pools, copied, strict=True))
