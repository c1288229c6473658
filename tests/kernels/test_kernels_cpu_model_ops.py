"""The compiled CPU elementwise ops (RMSNorm + residual add, RoPE, SiLU-and-mul, bf16 KV store)
against the torch references, and their dispatch.

The ops round every intermediate to bf16 where torch's bf16 ops do, so RoPE and the KV store
are bit-exact and so is the residual sum. RMSNorm sums squares in another order and SiLU's
exp() may differ in its last float bit, which can move a result across a bf16 rounding
boundary: those are checked to be bit-exact on at least 99.9% of elements (measured: all but
one in a million) and within one bf16 ulp everywhere.
"""

from __future__ import annotations

import pytest
import torch
from kernel_calls import CPU_MODEL_OP_NAMES, record_cpu_kernel_calls

import prefixcache.kernels as kernels
from prefixcache.kernels.cpu import (
    add_rms_norm_cpu_,
    apply_rotary_cpu_,
    cpu_model_ops_support,
    rms_norm_cpu,
    silu_and_mul_cpu,
    store_kv_cpu,
)
from prefixcache.kernels.cpu.build import unavailable_reason
from prefixcache.kernels.reference.kv_store import store_kv_reference
from prefixcache.kernels.reference.model_ops import (
    add_rms_norm_reference_,
    apply_rotary_reference_,
    rms_norm_reference,
    silu_and_mul_reference,
)

if not cpu_model_ops_support(torch.zeros(1, dtype=torch.bfloat16)):
    pytest.skip(
        f"compiled CPU kernels unavailable: {unavailable_reason()}", allow_module_level=True
    )

BF16 = torch.bfloat16
# (rows, width): a single row, row tails that are not a multiple of 16 lanes, and sizes past
# the threshold where the ops use every thread
SHAPES = [(1, 576), (7, 40), (64, 576), (33, 1000), (300, 64), (257, 576)]


def assert_nearly_bitwise(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-exact on >= 99.9% of elements, within one bf16 ulp of the expected value elsewhere."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    differ = got != expected
    assert differ.float().mean().item() <= 1e-3
    ulp = expected.float().abs() * 2.0**-7 + 1e-30
    assert bool(((got.float() - expected.float()).abs() <= ulp).all())


def strided_rows(rows: int, width: int, scale: float = 3.0) -> torch.Tensor:
    """A ``[rows, width]`` bf16 view with a row stride wider than ``width``."""
    return (torch.randn(rows, width + 24) * scale).to(BF16)[:, 5 : 5 + width]


@pytest.mark.parametrize(("rows", "width"), SHAPES)
def test_rms_norm_matches_reference(threads: int, rows: int, width: int) -> None:
    torch.manual_seed(rows * width)
    x, weight = strided_rows(rows, width), torch.randn(width).to(BF16)
    assert_nearly_bitwise(rms_norm_cpu(x, weight, 1e-5), rms_norm_reference(x, weight, 1e-5))


@pytest.mark.parametrize(("rows", "width"), SHAPES)
def test_add_rms_norm_updates_both_in_place(threads: int, rows: int, width: int) -> None:
    torch.manual_seed(rows + width)
    x, residual = strided_rows(rows, width), strided_rows(rows, width, scale=20.0)
    weight = torch.randn(width).to(BF16)
    x_ref, residual_ref = x.clone(), residual.clone()
    out = add_rms_norm_cpu_(x, residual, weight, 1e-6)
    add_rms_norm_reference_(x_ref, residual_ref, weight, 1e-6)
    assert out.data_ptr() == x.data_ptr()
    assert torch.equal(residual, residual_ref)  # the residual sum is bit-exact
    assert_nearly_bitwise(x, x_ref)


@pytest.mark.parametrize("head_dim", [16, 32, 48, 64, 128])
def test_rotary_is_bit_exact_on_a_fused_qkv_view(threads: int, head_dim: int) -> None:
    """RoPE in place on the q and k heads of a ``[tokens, q + k + v heads, head_dim]`` tensor
    leaves the v heads alone and equals the reference bit for bit."""
    torch.manual_seed(head_dim)
    qkv = (torch.randn(70, 15, head_dim) * 4).to(BF16)
    cos_sin = torch.randn(70, 2, head_dim).to(BF16)
    got, expected = qkv.clone(), qkv.clone()
    apply_rotary_cpu_(got[:, :12], cos_sin)
    apply_rotary_reference_(expected[:, :12], cos_sin)
    assert torch.equal(got, expected)
    assert torch.equal(got[:, 12:], qkv[:, 12:])


@pytest.mark.parametrize(("rows", "width"), SHAPES)
def test_silu_and_mul_matches_reference(threads: int, rows: int, width: int) -> None:
    torch.manual_seed(rows * 7 + width)
    gate_up = strided_rows(rows, 2 * width, scale=4.0)
    assert_nearly_bitwise(silu_and_mul_cpu(gate_up), silu_and_mul_reference(gate_up))


def test_silu_and_mul_extremes() -> None:
    """Large gates (e^-g underflows to 0 or overflows to inf) match the reference."""
    gate = torch.tensor([-1e4, -200.0, -88.0, -20.0, -0.0, 0.0, 1e-3, 20.0, 88.0, 200.0, 1e4])
    gate_up = torch.cat([gate, torch.full_like(gate, 1.5)]).to(BF16)[None]  # [1, 22]
    got = silu_and_mul_cpu(gate_up)
    assert bool(got.float().isfinite().all())
    assert torch.equal(got, silu_and_mul_reference(gate_up))


def test_store_kv_writes_the_reference_bytes() -> None:
    """Strided k/v views of a fused qkv, skipped tokens (slot -1), any slot order."""
    torch.manual_seed(3)
    qkv = torch.randn(40, 15, 64).to(BF16)
    slots = torch.randperm(10 * 16)[:40]
    slots[[3, 17]] = -1
    shape = (10, 16, 3, 64)
    got_k, got_v = torch.zeros(shape, dtype=BF16), torch.zeros(shape, dtype=BF16)
    expected_k, expected_v = got_k.clone(), got_v.clone()
    store_kv_cpu(qkv[:, 9:12], qkv[:, 12:], got_k, got_v, slots)
    store_kv_reference(qkv[:, 9:12], qkv[:, 12:], expected_k, expected_v, slots)
    assert torch.equal(got_k, expected_k) and torch.equal(got_v, expected_v)


def test_store_kv_rejects_a_slot_outside_the_pool_and_writes_nothing() -> None:
    k = torch.ones(3, 2, 32, dtype=BF16)
    k_cache, v_cache = torch.zeros(4, 8, 2, 32, dtype=BF16), torch.zeros(4, 8, 2, 32, dtype=BF16)
    for bad in (32, -2):
        with pytest.raises(ValueError, match="slot"):
            store_kv_cpu(k, k, k_cache, v_cache, torch.tensor([0, 1, bad]))
    assert not k_cache.any() and not v_cache.any()


def test_bad_inputs_raise_clear_errors() -> None:
    x = torch.zeros(4, 64, dtype=BF16)
    with pytest.raises(ValueError, match="bfloat16"):
        rms_norm_cpu(x.float(), torch.ones(64, dtype=BF16), 1e-5)
    with pytest.raises(ValueError, match="weight"):
        rms_norm_cpu(x, torch.ones(32, dtype=BF16), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm_cpu_(x, torch.zeros(3, 64, dtype=BF16), torch.ones(64, dtype=BF16), 1e-5)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        rms_norm_cpu(x.t(), torch.ones(4, dtype=BF16), 1e-5)
    with pytest.raises(ValueError, match="cos_sin"):
        apply_rotary_cpu_(x.view(4, 1, 64), torch.zeros(4, 2, 32, dtype=BF16))
    with pytest.raises(ValueError, match="even"):
        silu_and_mul_cpu(torch.zeros(2, 7, dtype=BF16))
    with pytest.raises(ValueError, match="no k/v scales"):
        store_kv_cpu(x.view(4, 1, 64), x.view(4, 1, 64), x.view(1, 4, 1, 64),
                     x.view(1, 4, 1, 64), torch.arange(4), torch.ones(()))  # fmt: skip


def test_empty_batches_are_no_ops() -> None:
    weight = torch.ones(64, dtype=BF16)
    assert rms_norm_cpu(torch.zeros(0, 64, dtype=BF16), weight, 1e-5).shape == (0, 64)
    assert silu_and_mul_cpu(torch.zeros(0, 64, dtype=BF16)).shape == (0, 32)
    empty = torch.zeros(0, 2, 64, dtype=BF16)
    assert apply_rotary_cpu_(empty, empty.clone()).shape == (0, 2, 64)


@pytest.mark.parametrize(
    ("dtype", "backend", "compiled"),
    [
        (torch.bfloat16, "auto", True),
        (torch.float32, "auto", False),  # float32: the reference
        (torch.bfloat16, "reference", False),  # forced
    ],
)
def test_dispatch_picks_the_compiled_ops_for_bf16_cpu_tensors(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, backend: str, compiled: bool
) -> None:
    calls = record_cpu_kernel_calls(monkeypatch)
    x, weight = torch.randn(5, 64).to(dtype), torch.ones(64, dtype=dtype)
    pool = torch.zeros(2, 4, 1, 64, dtype=dtype)
    with kernels.kernel_backend(backend):
        kernels.rms_norm(x, weight, 1e-5)
        kernels.add_rms_norm_(x, x.clone(), weight, 1e-5)
        kernels.apply_rotary_(x.view(5, 2, 32), torch.ones(5, 2, 32, dtype=dtype))
        kernels.silu_and_mul(x)
        kernels.store_kv(x.view(5, 1, 64), x.view(5, 1, 64), pool, pool.clone(), torch.arange(5))
    assert sorted(calls) == (sorted(CPU_MODEL_OP_NAMES) if compiled else [])
