"""The decoder's elementwise ops, dispatched: the compiled CPU kernels for bf16 CPU tensors
(AVX-512) and for float32 CPU tensors (AVX2/FMA), with backend "auto" and the kernels
available; the pure-torch references otherwise (CUDA, ``PREFIXCACHE_CPU_KERNELS=0``, backend
"reference").

Signatures and contracts are those of ``prefixcache.kernels.reference.model_ops``.
"""

from __future__ import annotations

import torch

from prefixcache.kernels.dispatch import cpu_kernels, get_kernel_backend
from prefixcache.kernels.reference.model_ops import (
    add_rms_norm_reference_,
    apply_rotary_reference_,
    rms_norm_reference,
    silu_and_mul_reference,
)


def uses_cpu_model_ops(*tensors: torch.Tensor) -> bool:
    """Whether an elementwise op on these tensors runs the compiled bf16 CPU kernel."""
    return get_kernel_backend() == "auto" and cpu_kernels().cpu_model_ops_support(*tensors)


def uses_cpu_f32_model_ops(*tensors: torch.Tensor) -> bool:
    """Whether an elementwise op on these tensors runs the compiled float32 CPU kernel."""
    return get_kernel_backend() == "auto" and cpu_kernels().f32_model_ops_support(*tensors)


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [num_tokens, hidden], new
    """``weight * (x / sqrt(mean(x^2) + eps))``, statistics in float32, output in x's dtype."""
    if uses_cpu_model_ops(x, weight):
        return cpu_kernels().rms_norm_cpu(x, weight, eps)
    if uses_cpu_f32_model_ops(x, weight):
        return cpu_kernels().rms_norm_f32(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def add_rms_norm_(
    x: torch.Tensor,  # [num_tokens, hidden], overwritten by the normed sum
    residual: torch.Tensor,  # [num_tokens, hidden], overwritten by x + residual
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # x
    """``residual += x``, then ``x = rms_norm(residual)``, both in place (no overlap)."""
    if uses_cpu_model_ops(x, residual, weight):
        return cpu_kernels().add_rms_norm_cpu_(x, residual, weight, eps)
    if uses_cpu_f32_model_ops(x, residual, weight):
        return cpu_kernels().add_rms_norm_f32_(x, residual, weight, eps)
    return add_rms_norm_reference_(x, residual, weight, eps)


def apply_rotary_(
    x: torch.Tensor,  # [num_tokens, heads, head_dim], rotated in place
    cos_sin: torch.Tensor,  # [num_tokens, 2, head_dim]: each token's cos row, then sin row
) -> torch.Tensor:  # x
    """RoPE, rotate-half layout, in place: ``x = x * cos + rotate_half(x) * sin``."""
    if uses_cpu_model_ops(x, cos_sin):
        return cpu_kernels().apply_rotary_cpu_(x, cos_sin)
    if uses_cpu_f32_model_ops(x, cos_sin):
        return cpu_kernels().apply_rotary_f32_(x, cos_sin)
    return apply_rotary_reference_(x, cos_sin)


def silu_and_mul(
    gate_up: torch.Tensor,  # [num_tokens, 2 * intermediate], gate columns first
) -> torch.Tensor:  # [num_tokens, intermediate], new
    """``silu(gate) * up``."""
    if uses_cpu_model_ops(gate_up):
        return cpu_kernels().silu_and_mul_cpu(gate_up)
    if uses_cpu_f32_model_ops(gate_up):
        return cpu_kernels().silu_and_mul_f32(gate_up)
    return silu_and_mul_reference(gate_up)
