"""The decoder's elementwise ops in plain torch, rounded exactly as Hugging Face Llama does.

RMSNorm computes its statistics in float32 and casts back before the weight multiplies; RoPE
is ``x * cos + rotate_half(x) * sin`` in the activation dtype; the MLP activation is
``silu(gate) * up``. The compiled CPU ops (``prefixcache.kernels.cpu.model_ops``) have the same
signatures and round at the same places.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_reference(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [num_tokens, hidden], new
    """``weight * (x / sqrt(mean(x^2) + eps))``, statistics in float32, output in x's dtype."""
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)  # [num_tokens, 1]
    normed = x32 * torch.rsqrt(variance + eps)
    return weight * normed.to(x.dtype)


def add_rms_norm_reference_(
    x: torch.Tensor,  # [num_tokens, hidden], overwritten by the normed sum
    residual: torch.Tensor,  # [num_tokens, hidden], overwritten by x + residual
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # x
    """The residual add and the next norm, in place: ``residual += x`` (rounded to its dtype),
    then ``x = rms_norm(residual)``. x and residual must not overlap."""
    residual.add_(x)
    return x.copy_(rms_norm_reference(residual, weight, eps))


def apply_rotary_reference_(
    x: torch.Tensor,  # [num_tokens, heads, head_dim], rotated in place
    cos_sin: torch.Tensor,  # [num_tokens, 2, head_dim]: each token's cos row, then sin row
) -> torch.Tensor:  # x
    """RoPE in the rotate-half (GPT-NeoX) layout: ``x = x * cos + rotate_half(x) * sin``."""
    cos, sin = cos_sin[:, 0:1], cos_sin[:, 1:2]  # [num_tokens, 1, head_dim] each
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [tokens, heads, head_dim]
    return x.copy_((x * cos).add_(rotated.mul_(sin)))


def silu_and_mul_reference(
    gate_up: torch.Tensor,  # [num_tokens, 2 * intermediate], gate columns first
) -> torch.Tensor:  # [num_tokens, intermediate], new
    """``silu(gate) * up`` (SwiGLU's activation)."""
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    return F.silu(gate).mul_(up)
