"""Tensor arguments checked and laid out for the compiled kernels' C signatures."""

from __future__ import annotations

from collections.abc import Callable

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


def store_kv_into(
    store: Callable[..., int],  # pc_store_kv or pc_f32_store_kv (one C signature)
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    dtype: torch.dtype,
) -> None:
    """Store new k/v into a contiguous ``dtype`` pool with the compiled ``store``, after
    checking its arguments (CPU ``dtype`` tensors of agreeing shapes, unit stride along
    head_dim, no scales); ValueError naming the problem otherwise, and for a slot outside
    ``[-1, num_blocks * block_size)`` (nothing written then)."""
    if k_scale is not None or v_scale is not None:
        raise ValueError(f"a {dtype} pool takes no k/v scales")
    for name, x in (("k", k), ("v", v)):
        if x.dtype is not dtype or not x.is_cpu:
            raise ValueError(f"{name} must be a CPU {dtype} tensor, got {x.dtype} on {x.device}")
        if x.dim() != 3 or (x.numel() and x.stride(-1) != 1):
            raise ValueError(
                f"{name} must be 3-D with a contiguous last dimension, got shape "
                f"{tuple(x.shape)} and strides {x.stride()}"
            )
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dtype is not dtype or not cache.is_contiguous() or cache.dim() != 4:
            raise ValueError(f"{name} must be a contiguous 4-D {dtype} pool")
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    tokens = k.shape[0]
    if v_cache.shape != k_cache.shape or k.shape != (tokens, num_kv_heads, head_dim):
        raise ValueError("k, v, k_cache and v_cache shapes disagree")
    if v.shape != k.shape or slot_mapping.shape != (tokens,):
        raise ValueError("v and slot_mapping must match k's tokens")
    slots = slot_mapping.to(torch.int64).contiguous()
    status = store(
        k.data_ptr(), k.stride(0), k.stride(1), v.data_ptr(), v.stride(0), v.stride(1),
        k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(), tokens, num_kv_heads,
        head_dim, num_blocks * block_size,
    )  # fmt: skip
    if status:
        raise ValueError("slot_mapping has a slot outside [-1, num_blocks * block_size)")
