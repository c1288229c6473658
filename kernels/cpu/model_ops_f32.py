"""The decoder's elementwise ops on float32 CPU tensors through the compiled AVX2/FMA kernels
(``model_ops_f32.c``): RMSNorm with the residual add, RoPE in place, SiLU-and-mul; and the
store of new keys and values into a float32 pool.

Same signatures and semantics as ``prefixcache.kernels.reference.model_ops``; results equal
the reference's to float32 rounding (the sum of squares and exp() run in another order), each
row's depending on that row alone. Shapes the kernels do not take (a hidden or intermediate
size not a multiple of 8, a head_dim not a multiple of 16, a last dimension that is not
contiguous) run the reference. ``f32_model_ops_support`` says when tensors qualify.
"""

from __future__ import annotations

import torch

from prefixcache.kernels.cpu.build import load_f32_library
from prefixcache.kernels.cpu.tensor_args import store_kv_into
from prefixcache.kernels.reference.model_ops import (
    add_rms_norm_reference_,
    apply_rotary_reference_,
    rms_norm_reference,
    silu_and_mul_reference,
)


def f32_model_ops_support(*tensors: torch.Tensor) -> bool:
    """True when every tensor is a CPU float32 tensor and the compiled kernels run here."""
    for t in tensors:
        if t.dtype is not torch.float32 or not t.is_cpu:
            return False
    return load_f32_library() is not None


def _rows_fit(x: torch.Tensor, multiple: int) -> bool:
    """2-D with a contiguous last dimension that is a multiple of ``multiple``."""
    return x.dim() == 2 and x.shape[1] % multiple == 0 and (x.numel() == 0 or x.stride(1) == 1)


def _norm_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return _rows_fit(x, 8) and weight.shape == (x.shape[1],) and weight.is_contiguous()


def rms_norm_f32(
    x: torch.Tensor,  # [num_tokens, hidden] float32
    weight: torch.Tensor,  # [hidden] float32
    eps: float,
) -> torch.Tensor:  # [num_tokens, hidden], new
    """``weight * (x / sqrt(mean(x^2) + eps))``."""
    if not _norm_fits(x, weight):
        return rms_norm_reference(x, weight, eps)
    out = torch.empty(x.shape, dtype=torch.float32)
    if x.shape[0]:
        load_f32_library().pc_f32_rms_norm(
            x.data_ptr(), x.stride(0), None, 0, weight.data_ptr(), out.data_ptr(),
            out.stride(0), x.shape[0], x.shape[1], eps, torch.get_num_threads(),
        )  # fmt: skip
    return out


def add_rms_norm_f32_(
    x: torch.Tensor,  # [num_tokens, hidden] float32, overwritten by the normed sum
    residual: torch.Tensor,  # [num_tokens, hidden] float32, overwritten by x + residual
    weight: torch.Tensor,  # [hidden] float32
    eps: float,
) -> torch.Tensor:  # x
    """``residual += x``, then ``x = rms_norm(residual)``, in place; x and residual must not
    overlap."""
    if not (_norm_fits(x, weight) and _rows_fit(residual, 8) and residual.shape == x.shape):
        return add_rms_norm_reference_(x, residual, weight, eps)
    if x.shape[0]:
        load_f32_library().pc_f32_rms_norm(
            x.data_ptr(), x.stride(0), residual.data_ptr(), residual.stride(0),
            weight.data_ptr(), x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], eps,
            torch.get_num_threads(),
        )  # fmt: skip
    return x


def apply_rotary_f32_(
    x: torch.Tensor,  # [num_tokens, heads, head_dim] float32, rotated in place
    cos_sin: torch.Tensor,  # [num_tokens, 2, head_dim] float32: cos row, then sin row
) -> torch.Tensor:  # x
    """RoPE, rotate-half layout, in place: ``x = x * cos + rotate_half(x) * sin``."""
    fits = (
        x.dim() == 3
        and x.shape[2] % 16 == 0
        and (x.numel() == 0 or x.stride(2) == 1)
        and cos_sin.shape == (x.shape[0], 2, x.shape[2])
        and cos_sin.stride(2) == 1
        and cos_sin.stride(1) == x.shape[2]
    )
    if not fits:
        return apply_rotary_reference_(x, cos_sin)
    if x.numel():
        load_f32_library().pc_f32_rotary(
            x.data_ptr(), x.stride(0), x.stride(1), cos_sin.data_ptr(), cos_sin.stride(0),
            x.shape[0], x.shape[1], x.shape[2], torch.get_num_threads(),
        )  # fmt: skip
    return x


def silu_and_mul_f32(
    gate_up: torch.Tensor,  # [num_tokens, 2 * intermediate] float32, gate columns first
) -> torch.Tensor:  # [num_tokens, intermediate], new
    """``silu(gate) * up``."""
    if not _rows_fit(gate_up, 16):
        return silu_and_mul_reference(gate_up)
    inter = gate_up.shape[1] // 2
    out = torch.empty((gate_up.shape[0], inter), dtype=torch.float32)
    if gate_up.shape[0]:
        load_f32_library().pc_f32_silu_and_mul(
            gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), out.stride(0),
            gate_up.shape[0], inter, torch.get_num_threads(),
        )  # fmt: skip
    return out


def store_kv_f32(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] float32
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] float32
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    slot_mapping: torch.Tensor,  # [num_tokens] int, slot = block * block_size + offset; -1 skip
    k_scale: torch.Tensor | None = None,  # must be None: a float32 pool takes no scales
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write token i's k/v into flat slot ``slot_mapping[i]`` of a contiguous float32 pool;
    tokens with slot -1 are skipped. ValueError (nothing written) for a slot outside the
    pool."""
    store_kv_into(
        load_f32_library().pc_f32_store_kv, k, v, k_cache, v_cache, slot_mapping, k_scale,
        v_scale, torch.float32,
    )
