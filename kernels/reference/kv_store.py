"""Writing new keys/values into the paged pool, and copying whole blocks for copy-on-write."""

from __future__ import annotations

import torch

from prefixcache.kernels.quantization import is_quantized, quantize


def store_kv_reference(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int, slot = block * block_size + offset; -1 skip
    k_scale: torch.Tensor | None = None,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write token i's k/v into flat slot ``slot_mapping[i]``; tokens with slot -1 are skipped.

    An fp8/int8 pool stores ``quantize(k / k_scale)`` (see ``prefixcache.kernels.quantization``);
    a floating-point pool stores a plain cast and ignores the scales."""
    keep = slot_mapping >= 0
    slots = slot_mapping if bool(keep.all()) else slot_mapping[keep]
    if slots is not slot_mapping:
        k, v = k[keep], v[keep]
    for new, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        flat = cache.view(-1, cache.shape[2], cache.shape[3])  # [num_slots, kv_heads, dim]
        stored = quantize(new, scale, cache.dtype)  # [kept, kv_heads, dim]
        if is_quantized(cache.dtype):  # index_copy_ has no fp8 kernel on CPU: copy raw bytes
            flat, stored = flat.view(torch.uint8), stored.view(torch.uint8)
        flat.index_copy_(0, slots.long(), stored)


FEW_PAIRS = 8  # up to this many block copies one by one, more with one gather


def copy_blocks_reference(
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    src_dst: torch.Tensor,  # [num_pairs, 2] int64: copy block src_dst[i, 0] into src_dst[i, 1]
) -> None:
    """Copy whole blocks (all slots, raw stored bytes) for copy-on-write; sources are read
    before any write."""
    if src_dst.numel() == 0:
        return
    pairs = src_dst.tolist()
    if len(pairs) <= FEW_PAIRS and not {d for _, d in pairs} & {s for s, _ in pairs}:
        for s, d in pairs:  # block views: a third of the cost of index tensors
            k_cache[d].copy_(k_cache[s])
            v_cache[d].copy_(v_cache[s])
        return
    src, dst = src_dst[:, 0].long(), src_dst[:, 1].long()
    k_cache[dst] = k_cache[src]
    v_cache[dst] = v_cache[src]
