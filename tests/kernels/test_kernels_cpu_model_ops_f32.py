"""The compiled float32 (AVX2/FMA) elementwise ops against the torch references: equal to
float32 rounding (atol = rtol = 1e-5 for unit-scale inputs), the residual sum bitwise; shapes
the kernels do not take fall back to the reference; the dispatch routes float32 CPU tensors
here. The store of new k/v into a float32 pool writes the reference's bytes."""

from __future__ import annotations

import pytest
import torch

from prefixcache.kernels import add_rms_norm_, apply_rotary_, rms_norm, silu_and_mul, store_kv
from prefixcache.kernels.cpu import (
    add_rms_norm_f32_,
    apply_rotary_f32_,
    f32_model_ops_support,
    rms_norm_f32,
    silu_and_mul_f32,
    store_kv_f32,
)
from prefixcache.kernels.cpu.build import F32_LIBRARY, unavailable_reason
from prefixcache.kernels.reference.kv_store import store_kv_reference
from prefixcache.kernels.reference.model_ops import (
    add_rms_norm_reference_,
    apply_rotary_reference_,
    rms_norm_reference,
    silu_and_mul_reference,
)

if not f32_model_ops_support(torch.zeros(1)):
    pytest.skip(
        f"float32 CPU ops unavailable: {unavailable_reason(F32_LIBRARY)}", allow_module_level=True
    )

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("rows", "hidden"), [(1, 64), (37, 576), (5, 20), (0, 64)])
def test_rms_norm_and_residual_add(rows: int, hidden: int, threads: int) -> None:
    x, residual, weight = randn(rows, hidden), randn(rows, hidden, seed=1), randn(hidden, seed=2)
    torch.testing.assert_close(rms_norm_f32(x, weight, 1e-5),
                               rms_norm_reference(x, weight, 1e-5), **TOLERANCE)  # fmt: skip
    got_x, got_residual = x.clone(), residual.clone()
    want_x, want_residual = x.clone(), residual.clone()
    assert add_rms_norm_f32_(got_x, got_residual, weight, 1e-5) is got_x
    add_rms_norm_reference_(want_x, want_residual, weight, 1e-5)
    assert torch.equal(got_residual, want_residual)  # one float32 add, as torch's
    torch.testing.assert_close(got_x, want_x, **TOLERANCE)


def test_rms_norm_of_strided_rows() -> None:
    rows, weight = randn(9, 128)[:, :64], randn(64, seed=2)
    torch.testing.assert_close(
        rms_norm_f32(rows, weight, 1e-6), rms_norm_reference(rows, weight, 1e-6), **TOLERANCE
    )


@pytest.mark.parametrize(("rows", "inter"), [(1, 1536), (40, 64), (3, 12)])
def test_silu_and_mul(rows: int, inter: int, threads: int) -> None:
    gate_up = randn(rows, 2 * inter) * 6  # gates far into both tails of the sigmoid
    torch.testing.assert_close(
        silu_and_mul_f32(gate_up), silu_and_mul_reference(gate_up), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(("tokens", "head_dim"), [(1, 64), (33, 128), (4, 24)])
def test_rotary_in_place_on_a_slice_of_fused_qkv(tokens: int, head_dim: int, threads) -> None:
    qkv, cos_sin = randn(tokens, 15, head_dim), randn(tokens, 2, head_dim, seed=3)
    got, want = qkv.clone(), qkv.clone()
    apply_rotary_f32_(got[:, :12], cos_sin)  # the q and k heads; v untouched
    apply_rotary_reference_(want[:, :12], cos_sin)
    torch.testing.assert_close(got, want, **TOLERANCE)
    assert torch.equal(got[:, 12:], qkv[:, 12:])


def test_rows_do_not_depend_on_the_rest_of_the_call() -> None:
    x, weight, gate_up = randn(50, 64), randn(64, seed=1), randn(50, 128, seed=2)
    assert torch.equal(rms_norm_f32(x, weight, 1e-5)[7:9], rms_norm_f32(x[7:9], weight, 1e-5))
    assert torch.equal(silu_and_mul_f32(gate_up)[20:], silu_and_mul_f32(gate_up[20:]))


def test_dispatch_routes_float32_cpu_tensors_here() -> None:
    x, weight, gate_up = randn(20, 64), randn(64, seed=1), randn(20, 128, seed=2)
    assert torch.equal(rms_norm(x, weight, 1e-5), rms_norm_f32(x, weight, 1e-5))
    assert torch.equal(silu_and_mul(gate_up), silu_and_mul_f32(gate_up))
    a, ra, b, rb = x.clone(), x.flip(0), x.clone(), x.flip(0)
    assert torch.equal(add_rms_norm_(a, ra, weight, 1e-5), add_rms_norm_f32_(b, rb, weight, 1e-5))
    qkv, cos_sin = randn(20, 5, 64), randn(20, 2, 64, seed=3)
    assert torch.equal(apply_rotary_(qkv.clone(), cos_sin), apply_rotary_f32_(qkv.clone(), cos_sin))


def test_store_kv_writes_the_reference_bytes() -> None:
    """Strided k/v views of a fused qkv, skipped tokens (slot -1), any slot order; the
    dispatch routes a float32 pool here."""
    qkv = randn(40, 15, 64)
    slots = torch.randperm(10 * 16, generator=torch.Generator().manual_seed(1))[:40]
    slots[[3, 17]] = -1
    shape = (10, 16, 3, 64)
    got_k, got_v = torch.zeros(shape), torch.zeros(shape)
    expected_k, expected_v = got_k.clone(), got_v.clone()
    store_kv_f32(qkv[:, 9:12], qkv[:, 12:], got_k, got_v, slots)
    store_kv_reference(qkv[:, 9:12], qkv[:, 12:], expected_k, expected_v, slots)
    assert torch.equal(got_k, expected_k) and torch.equal(got_v, expected_v)
    assert expected_k.any() and expected_v.any()  # the comparison is of written pools
    dispatched_k, dispatched_v = torch.zeros(shape), torch.zeros(shape)
    store_kv(qkv[:, 9:12], qkv[:, 12:], dispatched_k, dispatched_v, slots)
    assert torch.equal(dispatched_k, expected_k) and torch.equal(dispatched_v, expected_v)


def test_store_kv_rejects_bad_arguments_and_writes_nothing() -> None:
    k = torch.ones(3, 2, 32)
    k_cache, v_cache = torch.zeros(4, 8, 2, 32), torch.zeros(4, 8, 2, 32)
    for bad in (32, -2):
        with pytest.raises(ValueError, match="slot"):
            store_kv_f32(k, k, k_cache, v_cache, torch.tensor([0, 1, bad]))
    with pytest.raises(ValueError, match="no k/v scales"):
        store_kv_f32(k, k, k_cache, v_cache, torch.arange(3), torch.ones(()))
    with pytest.raises(ValueError, match="float32"):
        store_kv_f32(k.double(), k, k_cache, v_cache, torch.arange(3))
    with pytest.raises(ValueError, match="shapes disagree"):
        store_kv_f32(torch.ones(3, 1, 32), k, k_cache, v_cache, torch.arange(3))
    assert not k_cache.any() and not v_cache.any()


def test_store_kv_dispatch_takes_other_layouts_through_the_reference() -> None:
    """k/v strided along head_dim are not the compiled store's: the dispatch writes them with
    the reference instead of raising."""
    k, v = randn(6, 64, 2).transpose(1, 2), randn(6, 64, 2, seed=1).transpose(1, 2)  # [6, 2, 64]
    assert k.stride(-1) != 1
    slots = torch.tensor([3, 0, 5, -1, 9, 12])
    got_k, got_v = torch.zeros(4, 4, 2, 64), torch.zeros(4, 4, 2, 64)
    expected_k, expected_v = got_k.clone(), got_v.clone()
    store_kv(k, v, got_k, got_v, slots)
    store_kv_reference(k, v, expected_k, expected_v, slots)
    assert expected_k.any() and torch.equal(got_k, expected_k) and torch.equal(got_v, expected_v)
