"""Attention over a paged KV pool in plain torch: gather by block table, then SDPA.

Grouped-query attention is handled by SDPA's ``enable_gqa`` (query heads are grouped over
``num_heads // num_kv_heads`` KV heads, head h reading KV head ``h // group``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_context(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor,  # [max_blocks] int
    length: int,
) -> torch.Tensor:  # [length, num_kv_heads, head_dim]
    """The first ``length`` cached tokens of one sequence, in order."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    blocks = cache[block_table[:num_blocks].long()]  # [num_blocks, block_size, kv_heads, dim]
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:length]


def paged_prefill_attention_reference(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim] new tokens of all sequences
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32: cached tokens before the new ones
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Each new token attends to its sequence's whole cached context and, causally, to the new
    tokens up to itself. The new tokens' k/v come from ``k``/``v``, not from the cache."""
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    contexts = context_lens.tolist()
    for seq, context in enumerate(contexts):
        begin, end = starts[seq], starts[seq + 1]
        if begin == end:
            continue
        keys, values = k[begin:end], v[begin:end]  # [new, kv_heads, dim]
        if context:
            keys = torch.cat(
                [gather_context(k_cache, block_tables[seq], context).to(q.dtype), keys]
            )
            values = torch.cat(
                [gather_context(v_cache, block_tables[seq], context).to(q.dtype), values]
            )
        out[begin:end] = _attend(q[begin:end], keys, values, context, scale)
    return out


def _attend(
    q: torch.Tensor,  # [new, num_heads, head_dim]
    keys: torch.Tensor,  # [context + new, num_kv_heads, head_dim]
    values: torch.Tensor,  # [context + new, num_kv_heads, head_dim]
    context: int,
    scale: float,
) -> torch.Tensor:  # [new, num_heads, head_dim]
    new = q.shape[0]
    qh, kh, vh = q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1)
    if context == 0:
        out = F.scaled_dot_product_attention(
            qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        # new token i sees keys 0 .. context + i
        rows = torch.arange(new, device=q.device).unsqueeze(1) + context
        mask = torch.arange(context + new, device=q.device).unsqueeze(0) <= rows  # [new, total]
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True
        )
    return out.transpose(0, 1)


def paged_decode_attention_reference(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim] one new token per sequence
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32: tokens in cache, including the current one
    scale: float,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Each sequence's single query attends to all of its ``seq_lens`` cached tokens."""
    num_seqs = q.shape[0]
    block_size = k_cache.shape[1]
    max_len = int(seq_lens.max())
    max_blocks = -(-max_len // block_size)
    table = block_tables[:, :max_blocks].long()  # [num_seqs, max_blocks]
    kv_shape = (num_seqs, max_blocks * block_size, k_cache.shape[2], k_cache.shape[3])
    keys = k_cache[table].reshape(kv_shape)[:, :max_len].to(q.dtype)  # [seqs, len, kv_heads, d]
    values = v_cache[table].reshape(kv_shape)[:, :max_len].to(q.dtype)
    positions = torch.arange(max_len, device=q.device)
    mask = positions.unsqueeze(0) < seq_lens.to(q.device).unsqueeze(1)  # [num_seqs, max_len]
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),  # [seqs, heads, 1, dim]
        keys.transpose(1, 2),  # [seqs, kv_heads, len, dim]
        values.transpose(1, 2),
        attn_mask=mask[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    )  # [seqs, heads, 1, dim]
    return out.squeeze(2)
