"""Quantized KV storage: fp8 (e4m3, scaled) and int8 (scaled, symmetric).

A stored element is ``q = quantize(x / scale)`` and reads back as ``q * scale``. Scales are
static float32 tensors of shape ``[]``, ``[num_kv_heads]`` or ``[num_kv_heads, head_dim]``
(one per layer for K and one for V): a scalar, one per KV head, or one per head channel.
``None`` means scale 1.0.
The cache dtype itself says whether a pool is quantized, so every kernel takes the same
``k_scale`` / ``v_scale`` arguments whatever the pool holds; scales are ignored for a
floating-point (unquantized) pool.

Rounding: fp8 rounds to nearest even (torch and Triton casts agree); int8 rounds half up,
``floor(x + 0.5)``, written the same way in the reference and the Triton kernels so both
store identical bytes.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "fp8", "int8")
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
INT8_MAX = 127.0  # symmetric: -127 .. 127
QUANTIZED_DTYPES = (FP8_DTYPE, torch.int8)


def kv_storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The element dtype of the KV pool for ``kv_cache_dtype`` ("auto" keeps the model's)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype == "fp8":
        return FP8_DTYPE
    if kv_cache_dtype == "int8":
        return torch.int8
    raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; choose from {KV_CACHE_DTYPES}")


def is_quantized(dtype: torch.dtype) -> bool:
    """True for the pool dtypes that need a scale to read back."""
    return dtype in QUANTIZED_DTYPES


def quant_max(dtype: torch.dtype) -> float:
    """Largest magnitude a quantized element holds (before scaling)."""
    if dtype == FP8_DTYPE:
        return FP8_MAX
    if dtype == torch.int8:
        return INT8_MAX
    raise ValueError(f"{dtype} is not a quantized KV dtype")


def quantize(
    x: torch.Tensor,  # [..., num_kv_heads, head_dim] floating point
    scale: torch.Tensor | None,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
    dtype: torch.dtype,
) -> torch.Tensor:  # [..., num_kv_heads, head_dim] of ``dtype``
    """Scale, saturate and round ``x`` into a quantized dtype (float dtypes: a plain cast)."""
    if not is_quantized(dtype):
        return x.to(dtype)
    limit = quant_max(dtype)
    scaled = x.float()
    if scale is not None:
        scaled = scaled / full_scale(scale, x.shape[-2], x.shape[-1], x.device)
    scaled = scaled.clamp(-limit, limit)
    if dtype == torch.int8:
        scaled = torch.floor(scaled + 0.5)
    return scaled.to(dtype)


def dequantize(
    x: torch.Tensor,  # [..., num_kv_heads, head_dim] as stored in the pool
    scale: torch.Tensor | None,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
    out_dtype: torch.dtype,
) -> torch.Tensor:  # [..., num_kv_heads, head_dim] of ``out_dtype``
    """Read stored elements back as real values (float dtypes: a plain cast)."""
    if not is_quantized(x.dtype):
        return x.to(out_dtype)
    values = x.float()
    if scale is not None:
        values = values * full_scale(scale, x.shape[-2], x.shape[-1], x.device)
    return values.to(out_dtype)


def read_stored(
    pool: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] as stored
    slots: torch.Tensor,  # [n] int64 slot = block * block_size + offset
    scale: torch.Tensor | None,  # as for ``dequantize``
    out_dtype: torch.dtype,
) -> torch.Tensor:  # [n, num_kv_heads, head_dim] of ``out_dtype``
    """The values a pool holds at ``slots``, read back as attention reads them."""
    return dequantize(pool.flatten(0, 1)[slots], scale, out_dtype)


def scales_from_amax(
    amax: torch.Tensor,  # [num_kv_heads, head_dim] largest |value| seen per channel
    dtype: torch.dtype,
    headroom: float,
) -> torch.Tensor:  # [num_kv_heads, head_dim] float32
    """Static scales that map ``amax * headroom`` to the dtype's largest value.

    Channels never seen non-zero get the smallest positive scale of the others (or 1.0)."""
    amax = amax.float()
    positive = amax[amax > 0]
    floor = float(positive.min()) if positive.numel() else quant_max(dtype)
    return torch.clamp(amax, min=floor) * headroom / quant_max(dtype)


def full_scale(
    scale: torch.Tensor | float | None,
    num_kv_heads: int,
    head_dim: int,
    device: torch.device,
) -> torch.Tensor:  # [num_kv_heads, head_dim] float32, contiguous
    """Expand a scalar / per-head / per-channel scale to the layout the Triton kernels read."""
    if scale is None:
        return torch.ones(num_kv_heads, head_dim, dtype=torch.float32, device=device)
    scale = torch.as_tensor(scale, dtype=torch.float32, device=device)
    if scale.dim() == 1 and scale.numel() == num_kv_heads:
        scale = scale[:, None]
    return scale.expand(num_kv_heads, head_dim).contiguous()
