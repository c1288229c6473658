"""Tensor arguments checked and laid out for the compiled kernels' C signatures."""

from __future__ import annotations

import torch


def head_rows(
    name: str,
    x: torch.Tensor,  # [tokens, heads, head_dim]
    shape: tuple[int, int, int],
    dtype: torch.dtype,
) -> torch.Tensor:  # x, or a copy contiguous in its last dimension
    """``x`` checked to be a CPU tensor of ``dtype`` and ``shape``, with unit stride along its
    last dimension (copied only when it has not); ValueError naming ``name`` otherwise."""
    if x.dtype is not dtype or not x.is_cpu:
        raise ValueError(f"{name} must be a CPU {dtype} tensor, got {x.dtype} on {x.device}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {shape}")
    return x if x.stride(2) == 1 else x.contiguous()


def int32_tensor(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a contiguous CPU int32 tensor (a copy only when needed)."""
    if x.dtype is not torch.int32 or not x.is_cpu or not x.is_contiguous():
        x = x.to(device="cpu", dtype=torch.int32).contiguous()
    return x
