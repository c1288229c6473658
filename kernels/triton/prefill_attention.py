"""Paged prefill attention: new tokens attend to their paged context, then causally to each other.

One program per (tile of ``BLOCK_M`` new tokens, sequence, query head). It first streams the
sequence's cached context out of the pool (page looked up per token, int64 offsets, fp8/int8
dequantized in registers), then the new tokens' own k/v from the ``k``/``v`` inputs with the
causal mask ``key <= query``, keeping an online softmax throughout. With a sliding window W a
tile starts at its first token's window (the blocks before it are never read) and masks each
row's keys to its own last W; with a soft-cap c the scores become ``c * tanh(scores / c)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from prefixcache.kernels.quantization import full_scale
from prefixcache.kernels.triton.launch_config import NO_WINDOW, dot_dtype, quant_mode, soft_cap


@triton.jit
def _online_softmax_step(scores, v, m_i, l_i, acc):
    """Fold one tile of scores [M, N] and values [N, D] into the running (max, sum, acc). A row
    that has seen no key yet (every score -inf: outside its window) stays empty."""
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(scores - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _prefill_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_ptr,
    v_ptr,  # [num_tokens, kv_heads, head_dim]
    k_cache_ptr,
    v_cache_ptr,  # [num_blocks, block_size, kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks] int32
    query_start_ptr,  # [num_seqs + 1] int32
    context_lens_ptr,  # [num_seqs] int32
    k_scale_ptr,
    v_scale_ptr,  # [kv_heads, head_dim] float32
    out_ptr,  # [num_tokens, num_heads, head_dim]
    scale,
    window,  # keys a query sees (its last ones): the sliding window, or NO_WINDOW
    softcap,  # scores become softcap * tanh(scores / softcap) when SOFTCAP
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    block_size,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr,
    DOT: tl.constexpr,  # operand dtype of the tl.dot calls
    SOFTCAP: tl.constexpr,
):
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    kv_head = head // GROUP
    begin = tl.load(query_start_ptr + seq)
    num_new = tl.load(query_start_ptr + seq + 1) - begin
    if tile * BLOCK_M < num_new:
        context = tl.load(context_lens_ptr + seq)
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] index among new tokens
        row_mask = rows < num_new
        dims = tl.arange(0, BLOCK_D)
        dim_mask = dims < HEAD_DIM
        tokens = (begin + rows).to(tl.int64)
        q = tl.load(
            q_ptr + tokens[:, None] * stride_qt + head * stride_qh + dims[None, :],
            mask=row_mask[:, None] & dim_mask[None, :],
            other=0.0,
        ).to(DOT)  # [BLOCK_M, BLOCK_D]
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # 1) the cached context, from the tile's first token's window on (all without one)
        if QUANT != 0:
            k_scale = tl.load(k_scale_ptr + kv_head * HEAD_DIM + dims, mask=dim_mask, other=1.0)
            v_scale = tl.load(v_scale_ptr + kv_head * HEAD_DIM + dims, mask=dim_mask, other=1.0)
        table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
        first_seen = tl.maximum(context + tile * BLOCK_M - window + 1, 0)
        for start in range(tl.minimum(first_seen, context), context, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < context
            block_ids = tl.load(table_row + cols // block_size, mask=col_mask, other=0)
            slots = (
                block_ids.to(tl.int64) * stride_cb
                + (cols % block_size).to(tl.int64) * stride_cs
                + kv_head * stride_ch
            )  # [BLOCK_N] int64
            kv_mask = col_mask[:, None] & dim_mask[None, :]
            k = tl.load(k_cache_ptr + slots[:, None] + dims[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + slots[:, None] + dims[None, :], mask=kv_mask, other=0.0)
            if QUANT != 0:
                k = k.to(tl.float32) * k_scale[None, :]
                v = v.to(tl.float32) * v_scale[None, :]
            scores = tl.dot(q, tl.trans(k.to(DOT))) * scale  # [BLOCK_M, BLOCK_N]
            if SOFTCAP:
                scores = soft_cap(scores, softcap)
            visible = col_mask[None, :] & (cols[None, :] > context + rows[:, None] - window)
            scores = tl.where(visible, scores, float("-inf"))
            m_i, l_i, acc = _online_softmax_step(scores, v.to(DOT), m_i, l_i, acc)

        # 2) the new tokens themselves, causally (from the tile's first token's window on)
        last = tl.minimum((tile + 1) * BLOCK_M, num_new)
        for start in range(tl.maximum(tile * BLOCK_M - window + 1, 0), last, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_mask = cols < num_new
            kv_tokens = (begin + cols).to(tl.int64)
            kv_mask = col_mask[:, None] & dim_mask[None, :]
            k = tl.load(
                k_ptr + kv_tokens[:, None] * stride_kt + kv_head * stride_kh + dims[None, :],
                mask=kv_mask,
                other=0.0,
            )
            v = tl.load(
                v_ptr + kv_tokens[:, None] * stride_vt + kv_head * stride_vh + dims[None, :],
                mask=kv_mask,
                other=0.0,
            )
            scores = tl.dot(q, tl.trans(k.to(DOT))) * scale
            if SOFTCAP:
                scores = soft_cap(scores, softcap)
            visible = col_mask[None, :] & (cols[None, :] <= rows[:, None])
            visible = visible & (cols[None, :] > rows[:, None] - window)
            scores = tl.where(visible, scores, float("-inf"))
            m_i, l_i, acc = _online_softmax_step(scores, v.to(DOT), m_i, l_i, acc)

        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # padding rows may see no key
        tl.store(
            out_ptr + tokens[:, None] * stride_ot + head * stride_oh + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & dim_mask[None, :],
        )


def paged_prefill_attention_triton(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim] new tokens of all sequences
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    k_scale: torch.Tensor | None = None,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    *,
    block_m: int = 64,
    block_n: int = 64,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Same contract as ``paged_prefill_attention_reference`` (computed in float32: a result
    near the reference's, not its bits)."""
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = context_lens.shape[0]
    num_kv_heads = k_cache.shape[2]
    out = torch.empty_like(q)
    if num_tokens == 0 or num_seqs == 0:
        return out
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    assert num_heads % num_kv_heads == 0
    query_start_loc = query_start_loc.to(torch.int32)
    max_new = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    block_tables = block_tables.contiguous()
    grid = (triton.cdiv(max_new, block_m), num_seqs, num_heads)
    _prefill_kernel[grid](
        q,
        k,
        v,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        context_lens.to(torch.int32),
        full_scale(k_scale, num_kv_heads, head_dim, q.device),
        full_scale(v_scale, num_kv_heads, head_dim, q.device),
        out,
        scale,
        sliding_window or NO_WINDOW,
        softcap or 0.0,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        k_cache.shape[1],
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        QUANT=quant_mode(k_cache.dtype),
        DOT=dot_dtype(q.dtype),
        SOFTCAP=softcap is not None,
    )
    return out
