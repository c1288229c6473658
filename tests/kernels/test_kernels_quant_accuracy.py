"""Quantized KV (fp8 e4m3 / int8, per-channel static scales) against unquantized attention.

Stated tolerances, on unit-Gaussian keys/values with scales from their per-channel max:
element round trip within half a quantization step (int8) or 1/16 relative (fp8), and
attention output max abs error below 0.15 (fp8) and 0.04 (int8) with logits of std ~2
(measured over 10 seeds: at most 0.115 and 0.030).
"""

from __future__ import annotations

import pytest
import torch
from paged_kernel_inputs import make_pool

from prefixcache.kernels.quantization import (
    dequantize,
    full_scale,
    kv_storage_dtype,
    quantize,
    scales_from_amax,
)
from prefixcache.kernels.reference.paged_attention import paged_decode_attention_reference
from prefixcache.kernels.triton import paged_decode_attention_triton

OUTPUT_TOLERANCE = {"fp8": 0.15, "int8": 0.04}


def test_int8_round_trip_within_half_a_step() -> None:
    x = torch.randn(500, 2, 64)
    scale = scales_from_amax(x.abs().amax(0), torch.int8, 1.0)  # [2, 64]
    back = dequantize(quantize(x, scale, torch.int8), scale, torch.float32)
    assert bool(((back - x).abs() <= scale / 2 + 1e-7).all())


def test_fp8_round_trip_within_one_sixteenth_relative() -> None:
    x = torch.randn(500, 2, 64) * 5
    scale = torch.tensor(0.1)  # scalar scale; |x| / scale stays below 448
    back = dequantize(quantize(x, scale, torch.float8_e4m3fn), scale, torch.float32)
    normal = x.abs() >= 0.1 * 2**-6  # e4m3 normal range after scaling
    relative = ((back - x).abs() / x.abs())[normal]
    assert float(relative.max()) <= 1 / 16


def test_quantize_saturates_instead_of_overflowing() -> None:
    x = torch.tensor([[[1e9, -1e9]]])
    for dtype, limit in ((torch.float8_e4m3fn, 448.0), (torch.int8, 127.0)):
        assert dequantize(quantize(x, None, dtype), None, torch.float32).tolist() == [
            [[limit, -limit]]
        ]


def test_scale_shapes_expand_per_head_and_per_channel() -> None:
    per_head = full_scale(torch.tensor([1.0, 2.0]), 2, 4, torch.device("cpu"))
    assert per_head.tolist() == [[1.0] * 4, [2.0] * 4]
    assert full_scale(None, 2, 4, torch.device("cpu")).shape == (2, 4)
    # a channel that never saw a non-zero value still gets a usable (positive) scale
    scales = scales_from_amax(torch.tensor([[0.0, 2.0]]), torch.int8, 1.0)
    assert bool((scales > 0).all())
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_storage_dtype("int4", torch.float32)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8"])
def test_quantized_decode_close_to_unquantized(kv_cache_dtype: str) -> None:
    lengths = [1, 45, 100]
    exact = make_pool(lengths, 2, 64, 16, seed=3)
    quant = make_pool(lengths, 2, 64, 16, kv_cache_dtype=kv_cache_dtype, seed=3)
    q = torch.randn(3, 6, 64) * 2  # peaky enough that errors in keys matter
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    args = (q, exact.k_cache, exact.v_cache, exact.block_tables, seq_lens, 0.125)
    expected = paged_decode_attention_reference(*args)
    qargs = (q, quant.k_cache, quant.v_cache, quant.block_tables, seq_lens, 0.125)
    scales = (quant.k_scale, quant.v_scale)
    reference = paged_decode_attention_reference(*qargs, *scales)
    interpreted = paged_decode_attention_triton(*qargs, *scales, num_splits=2)
    assert float((reference - expected).abs().max()) < OUTPUT_TOLERANCE[kv_cache_dtype]
    torch.testing.assert_close(interpreted, reference, atol=2e-5, rtol=1e-4)
