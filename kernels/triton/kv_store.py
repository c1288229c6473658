"""Triton KV write (with fp8/int8 quantization) and whole-block copy for copy-on-write."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from prefixcache.kernels.quantization import full_scale, is_quantized, quant_max
from prefixcache.kernels.triton.launch_config import quant_mode


@triton.jit
def _round_to_e4m3(x):
    """Round fp32 ``x`` (already within +-448) to the nearest e4m3 value, ties to even, so the
    cast that follows is exact. Explicit because Triton's CPU interpreter drops the carry when
    a cast rounds up into the next binade (126.9 -> 64 instead of 128); GPUs agree either way.
    """
    bits = x.to(tl.uint32, bitcast=True)
    lsb = (bits >> 20) & 1  # e4m3 keeps 3 of fp32's 23 mantissa bits
    normal = ((bits + 0x7FFFF + lsb) & 0xFFF00000).to(tl.float32, bitcast=True)
    ticks = x * 512.0  # below 2**-6 e4m3 is subnormal, spaced 2**-9
    nearest = tl.floor(ticks + 0.5)
    odd_tie = ((nearest - ticks) == 0.5) & ((nearest - 2.0 * tl.floor(nearest * 0.5)) == 1.0)
    magnitude = tl.abs(tl.where(odd_tie, nearest - 1.0, nearest) / 512.0)
    sign = bits & 0x80000000  # keep -0.0 for tiny negatives, as torch's cast does
    subnormal = (magnitude.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(x) < 0.015625, subnormal, normal)


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,  # [num_tokens, kv_heads, head_dim]
    k_cache_ptr,
    v_cache_ptr,  # [num_blocks, block_size, kv_heads, head_dim]
    slot_ptr,  # [num_tokens] int64
    k_scale_ptr,
    v_scale_ptr,  # [kv_heads, head_dim] float32
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,  # cache strides (head_dim stride is 1)
    block_size,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr,  # 0 plain cast, 1 fp8, 2 int8
    QMAX: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        block = slot // block_size
        offset = slot % block_size
        heads = tl.arange(0, BLOCK_H)[:, None]
        dims = tl.arange(0, BLOCK_D)[None, :]
        mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
        dst = block * stride_cb + offset * stride_cs + heads * stride_ch + dims
        k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
        v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
        if QUANT != 0:
            k_scale = tl.load(k_scale_ptr + heads * HEAD_DIM + dims, mask=mask, other=1.0)
            v_scale = tl.load(v_scale_ptr + heads * HEAD_DIM + dims, mask=mask, other=1.0)
            k = tl.minimum(tl.maximum(k.to(tl.float32) / k_scale, -QMAX), QMAX)
            v = tl.minimum(tl.maximum(v.to(tl.float32) / v_scale, -QMAX), QMAX)
            if QUANT == 1:
                k = _round_to_e4m3(k)
                v = _round_to_e4m3(v)
            if QUANT == 2:
                k = tl.floor(k + 0.5)
                v = tl.floor(v + 0.5)
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv_triton(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int; -1 skips the token
    k_scale: torch.Tensor | None = None,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
    v_scale: torch.Tensor | None = None,
) -> None:
    """One program per token; same contract as ``store_kv_reference``."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.stride(-1) == 1
    assert k_cache.stride() == v_cache.stride()
    mode = quant_mode(k_cache.dtype)
    k_scale = full_scale(k_scale, num_kv_heads, head_dim, k.device)
    v_scale = full_scale(v_scale, num_kv_heads, head_dim, k.device)
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping.to(torch.int64),
        k_scale,
        v_scale,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.shape[1],
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        QUANT=mode,
        QMAX=quant_max(k_cache.dtype) if mode else 0.0,
    )


@triton.jit
def _copy_blocks_kernel(
    k_cache_ptr,
    v_cache_ptr,  # contiguous [num_blocks, block_numel] viewed as raw elements
    pairs_ptr,  # [num_pairs, 2] int64
    block_numel,
    CHUNK: tl.constexpr,
):
    pair = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1).to(tl.int64)
    src = tl.load(pairs_ptr + 2 * pair)
    dst = tl.load(pairs_ptr + 2 * pair + 1)
    offsets = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offsets < block_numel
    k = tl.load(k_cache_ptr + src * block_numel + offsets, mask=mask)
    v = tl.load(v_cache_ptr + src * block_numel + offsets, mask=mask)
    tl.store(k_cache_ptr + dst * block_numel + offsets, k, mask=mask)
    tl.store(v_cache_ptr + dst * block_numel + offsets, v, mask=mask)


def copy_blocks_triton(
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] contiguous
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] contiguous
    src_dst: torch.Tensor,  # [num_pairs, 2] int64
) -> None:
    """Copy raw block bytes. Precondition (copy-on-write guarantees it): no destination is also
    a source, so the parallel copies do not depend on order."""
    if src_dst.numel() == 0:
        return
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    block_numel = k_cache[0].numel()
    chunk = min(4096, triton.next_power_of_2(block_numel))
    # fp8 copies as raw bytes: no conversion can touch the stored bits
    raw = torch.uint8 if is_quantized(k_cache.dtype) else k_cache.dtype
    pairs = src_dst.to(device=k_cache.device, dtype=torch.int64).contiguous()
    grid = (pairs.shape[0], triton.cdiv(block_numel, chunk))
    _copy_blocks_kernel[grid](k_cache.view(raw), v_cache.view(raw), pairs, block_numel, CHUNK=chunk)
