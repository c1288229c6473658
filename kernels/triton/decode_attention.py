"""Paged decode attention as split-K (flash-decoding) with grouped-query heads.

Pass 1: one program per (sequence, KV head, split) walks its share of the sequence's tokens,
``BLOCK_N`` at a time, gathering each token's page from the block table (so any power-of-two
block size works, pages smaller or larger than a tile alike; tiles need not align to pages).
All query heads of the KV head's group are processed together as the rows of one ``tl.dot``;
the program keeps an online-softmax running max, sum and unnormalised output. Pass 2 merges
the splits.

With a sliding window W the splits share only the sequence's last W tokens: the blocks before
them are never read. With a soft-cap c the scores become ``c * tanh(scores / c)`` (Gemma 2).

Page offsets are computed in int64 (``block_id * stride``), so pools beyond 2**31 elements and
block ids near the top of a large pool are addressed correctly. fp8/int8 pools are
dequantized in registers: ``stored * scale[kv_head, channel]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from prefixcache.kernels.quantization import full_scale
from prefixcache.kernels.triton.launch_config import NO_WINDOW, dot_dtype, quant_mode, soft_cap

MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64


@triton.jit
def _decode_split_kernel(
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,
    v_cache_ptr,  # [num_blocks, block_size, kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks] int32
    seq_lens_ptr,  # [num_seqs] int32
    k_scale_ptr,
    v_scale_ptr,  # [kv_heads, head_dim] float32
    part_out_ptr,  # [num_seqs, num_heads, num_splits, head_dim] float32
    part_max_ptr,
    part_sum_ptr,  # [num_seqs, num_heads, num_splits] float32
    scale,
    window,  # keys a query sees (its last ones): the sliding window, or 2**30
    softcap,  # scores become softcap * tanh(scores / softcap); 0: unchanged
    stride_qs,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    block_size,
    num_heads,
    num_splits,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    QUANT: tl.constexpr,
    DOT: tl.constexpr,  # operand dtype of the tl.dot calls
    SOFTCAP: tl.constexpr,  # whether softcap applies
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    lowest = tl.maximum(seq_len - window, 0)  # the first key the query sees
    per_split = tl.cdiv(tl.cdiv(seq_len - lowest, num_splits), BLOCK_N) * BLOCK_N
    start = lowest + split * per_split
    end = tl.minimum(start + per_split, seq_len)

    group_rows = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + group_rows  # [BLOCK_H] query heads of this KV head
    head_mask = group_rows < GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :],
        mask=head_mask[:, None] & dim_mask[None, :],
        other=0.0,
    ).to(DOT)  # [BLOCK_H, BLOCK_D]
    if QUANT != 0:
        k_scale = tl.load(k_scale_ptr + kv_head * HEAD_DIM + dims, mask=dim_mask, other=1.0)
        v_scale = tl.load(v_scale_ptr + kv_head * HEAD_DIM + dims, mask=dim_mask, other=1.0)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile in range(start, end, BLOCK_N):
        tokens = tile + tl.arange(0, BLOCK_N)  # [BLOCK_N]
        token_mask = tokens < end
        block_ids = tl.load(table_row + tokens // block_size, mask=token_mask, other=0)
        rows = (
            block_ids.to(tl.int64) * stride_cb
            + (tokens % block_size).to(tl.int64) * stride_cs
            + kv_head * stride_ch
        )  # [BLOCK_N] int64 element offsets
        kv_mask = token_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_cache_ptr + rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if QUANT != 0:
            k = k.to(tl.float32) * k_scale[None, :]
            v = v.to(tl.float32) * v_scale[None, :]
        scores = tl.dot(q, tl.trans(k.to(DOT))) * scale  # [BLOCK_H, BLOCK_N] float32
        if SOFTCAP:
            scores = soft_cap(scores, softcap)
        scores = tl.where(token_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v.to(DOT))
        m_i = m_new

    part = (seq * num_heads + heads) * num_splits + split  # [BLOCK_H]
    tl.store(part_max_ptr + part, m_i, mask=head_mask)
    tl.store(part_sum_ptr + part, l_i, mask=head_mask)
    tl.store(
        part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :],
        acc,
        mask=head_mask[:, None] & dim_mask[None, :],
    )


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr,
    part_max_ptr,
    part_sum_ptr,
    out_ptr,  # [num_seqs, num_heads, head_dim]
    stride_os,
    stride_oh,
    num_heads,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    split_mask = splits < num_splits
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_DIM
    part = (seq * num_heads + head) * num_splits + splits  # [BLOCK_S]
    m = tl.load(part_max_ptr + part, mask=split_mask, other=float("-inf"))
    sums = tl.load(part_sum_ptr + part, mask=split_mask, other=0.0)
    acc = tl.load(
        part_out_ptr + part[:, None] * HEAD_DIM + dims[None, :],
        mask=split_mask[:, None] & dim_mask[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    weights = tl.exp(m - tl.max(m, axis=0))  # empty splits (max -inf) weigh 0
    out = tl.sum(acc * weights[:, None], axis=0) / tl.sum(sums * weights, axis=0)
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dim_mask,
    )


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device
) -> int:
    """Enough splits to give every SM about two programs, each split >= 256 tokens."""
    sms = 4
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = triton.cdiv(2 * sms, num_seqs * num_kv_heads)
    return max(1, min(wanted, triton.cdiv(max_seq_len, MIN_TOKENS_PER_SPLIT), MAX_SPLITS))


def paged_decode_attention_triton(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, each >= 1
    scale: float,
    k_scale: torch.Tensor | None = None,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    *,
    num_splits: int | None = None,  # default: choose_num_splits
    block_n: int | None = None,  # tokens per tile (any power of two >= 16); default 64 / 32
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Same contract as ``paged_decode_attention_reference`` (computed in float32: a result
    near the reference's, not its bits)."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    assert num_heads % num_kv_heads == 0
    group = num_heads // num_kv_heads
    if num_splits is None:
        longest = int(seq_lens.max())
        if sliding_window is not None:
            longest = min(longest, sliding_window)
        num_splits = choose_num_splits(num_seqs, num_kv_heads, longest, q.device)
    block_tables = block_tables.contiguous()
    seq_lens = seq_lens.to(torch.int32)
    f32 = {"dtype": torch.float32, "device": q.device}
    part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, **f32)
    part_max = torch.empty(num_seqs, num_heads, num_splits, **f32)
    part_sum = torch.empty_like(part_max)
    block_d = max(16, triton.next_power_of_2(head_dim))
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        full_scale(k_scale, num_kv_heads, head_dim, q.device),
        full_scale(v_scale, num_kv_heads, head_dim, q.device),
        part_out,
        part_max,
        part_sum,
        scale,
        sliding_window or NO_WINDOW,
        softcap or 0.0,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        k_cache.shape[1],
        num_heads,
        num_splits,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d,
        BLOCK_N=block_n or (64 if head_dim <= 128 else 32),
        QUANT=quant_mode(k_cache.dtype),
        DOT=dot_dtype(q.dtype),
        SOFTCAP=softcap is not None,
    )
    _decode_reduce_kernel[(num_seqs, num_heads)](
        part_out,
        part_max,
        part_sum,
        out,
        out.stride(0),
        out.stride(1),
        num_heads,
        num_splits,
        HEAD_DIM=head_dim,
        BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
        BLOCK_D=block_d,
    )
    return out
