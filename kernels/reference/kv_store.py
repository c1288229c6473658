"""Writing new keys/values into the paged pool, and copying whole blocks for copy-on-write."""

from __future__ import annotations

import torch


def store_kv_reference(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int, slot = block * block_size + offset; -1 skip
) -> None:
    """Write token i's k/v into flat slot ``slot_mapping[i]``; tokens with slot -1 are skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping if bool(keep.all()) else slot_mapping[keep]
    flat_k = k_cache.view(-1, k_cache.shape[2], k_cache.shape[3])  # [num_slots, kv_heads, dim]
    flat_v = v_cache.view(-1, v_cache.shape[2], v_cache.shape[3])
    if slots is not slot_mapping:
        k, v = k[keep], v[keep]
    flat_k.index_copy_(0, slots.long(), k.to(flat_k.dtype))
    flat_v.index_copy_(0, slots.long(), v.to(flat_v.dtype))


def copy_blocks_reference(
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    src_dst: torch.Tensor,  # [num_pairs, 2] int64: copy block src_dst[i, 0] into src_dst[i, 1]
) -> None:
    """Copy whole blocks (all slots) for copy-on-write; sources are read before any write."""
    if src_dst.numel() == 0:
        return
    src, dst = src_dst[:, 0].long(), src_dst[:, 1].long()
    k_cache[dst] = k_cache[src]
    v_cache[dst] = v_cache[src]
