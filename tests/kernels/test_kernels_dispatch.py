"""Dispatch: on CPU the compiled kernel (bf16) or the reference, Triton when forced
(interpreted here) or on CUDA."""

from __future__ import annotations

import pytest
import torch
from kernel_calls import record_calls, record_cpu_kernel_calls
from paged_kernel_inputs import make_pool, varlen_queries

import prefixcache.kernels as kernels
from prefixcache.kernels import dispatch

KERNEL_NAMES = (
    "store_kv_triton",
    "copy_blocks_triton",
    "paged_decode_attention_triton",
    "paged_prefill_attention_triton",
)


@pytest.fixture
def triton_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every call that dispatch routes to a Triton kernel."""
    return record_calls(monkeypatch, dispatch.triton_kernels(), KERNEL_NAMES)


def run_all_kernels(kv_cache_dtype: str) -> list[torch.Tensor]:
    pool = make_pool([20, 3], 2, 64, 16, num_blocks=16, kv_cache_dtype=kv_cache_dtype)
    scales = (pool.k_scale, pool.v_scale)
    q, k, v, starts = varlen_queries([4, 1], 4, 2, 64)
    slots = torch.tensor([-1, 200, 201, 202, 203], dtype=torch.int64)
    kernels.store_kv(k, v, pool.k_cache, pool.v_cache, slots, *scales)
    kernels.copy_blocks(pool.k_cache, pool.v_cache, torch.tensor([[12, 15]]))
    lens = torch.tensor([20, 3], dtype=torch.int32)
    decode = kernels.paged_decode_attention(
        q[:2], pool.k_cache, pool.v_cache, pool.block_tables, lens, 0.125, *scales
    )
    prefill = kernels.paged_prefill_attention(
        q, k, v, pool.k_cache, pool.v_cache, pool.block_tables, starts, lens, 0.125, *scales
    )
    return [pool.k_cache.float(), pool.v_cache.float(), decode, prefill]


def test_cpu_tensors_use_the_reference_by_default(triton_calls: list[str]) -> None:
    assert dispatch.get_kernel_backend() == "auto"
    assert not dispatch.uses_triton(torch.zeros(1))
    run_all_kernels("auto")
    assert triton_calls == []


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_forced_triton_runs_every_kernel_and_matches(
    triton_calls: list[str], kv_cache_dtype: str
) -> None:
    expected = run_all_kernels(kv_cache_dtype)
    with kernels.kernel_backend("triton"):
        got = run_all_kernels(kv_cache_dtype)
    assert dispatch.get_kernel_backend() == "auto"  # restored
    assert sorted(triton_calls) == sorted(KERNEL_NAMES)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=2e-5, rtol=1e-4)


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError, match="backend"):
        kernels.set_kernel_backend("cuda")
    assert dispatch.get_kernel_backend() == "auto"


@pytest.mark.parametrize(
    ("dtype", "kv_cache_dtype", "backend", "compiled"),
    [
        (torch.bfloat16, "auto", "auto", True),
        (torch.float32, "auto", "auto", False),  # fp32: the reference
        (torch.bfloat16, "int8", "auto", True),  # quantized pool: dequantized while packing
        (torch.bfloat16, "auto", "reference", False),  # forced
    ],
)
def test_cpu_attention_picks_the_compiled_kernel_for_bf16_queries(
    monkeypatch: pytest.MonkeyPatch, dtype, kv_cache_dtype: str, backend: str, compiled: bool
) -> None:
    if compiled and not dispatch.cpu_kernels().cpu_attention_available():
        pytest.skip("the compiled CPU kernel is unavailable on this machine")
    calls = record_cpu_kernel_calls(monkeypatch)
    pool = make_pool([20, 3], 2, 64, 16, num_blocks=16, kv_cache_dtype=kv_cache_dtype)
    if kv_cache_dtype == "auto":
        pool.k_cache, pool.v_cache = pool.k_cache.to(dtype), pool.v_cache.to(dtype)
    q, k, v, starts = varlen_queries([4, 1], 4, 2, 64)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    lens = torch.tensor([20, 3], dtype=torch.int32)
    scales = (pool.k_scale, pool.v_scale)
    with kernels.kernel_backend(backend):
        kernels.paged_decode_attention(
            q[:2], pool.k_cache, pool.v_cache, pool.block_tables, lens, 0.125, *scales
        )
        kernels.paged_prefill_attention(
            q, k, v, pool.k_cache, pool.v_cache, pool.block_tables, starts, lens, 0.125, *scales
        )
    expected = ["paged_decode_attention_cpu", "paged_prefill_attention_cpu"] if compiled else []
    assert calls == expected
