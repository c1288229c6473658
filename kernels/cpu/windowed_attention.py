"""Sliding-window attention compiled for AVX2/FMA CPUs (``windowed_attention.c``): each query
token attends to exactly the last ``window`` keys of its sequence, read from the paged pool,
computed alone in an order fixed by its own key range, so its output is the same bits however
its prompt was chunked or cached and whether it came as a prefill row or a decode step."""

from __future__ import annotations

import torch

from prefixcache.kernels.cpu.build import load_f32_library

MAX_HEAD_DIM = 256
MAX_GROUP = 16
DTYPES = (torch.float32, torch.bfloat16)


def windowed_attention_supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the compiled kernel takes these inputs: CPU float32/bf16 queries over an
    unquantized CPU pool of the same dtype family, head_dim a multiple of 8 up to 256, at
    most 16 query heads a KV head."""
    if not (q.is_cpu and k_cache.is_cpu):
        return False
    return (q.dtype in DTYPES and k_cache.dtype in DTYPES and k_cache.is_contiguous()
            and windowed_shape_supported(q.shape[1], k_cache.shape[2], q.shape[2]))


def windowed_shape_supported(heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether the compiled kernel runs here and takes these heads: head_dim a multiple of 8
    up to 256, at most 16 query heads a KV head."""
    return (load_f32_library() is not None and head_dim % 8 == 0 and 0 < head_dim <= MAX_HEAD_DIM
            and kv_heads > 0 and heads % kv_heads == 0
            and heads // kv_heads <= MAX_GROUP)  # fmt: skip


def windowed_attention_cpu(
    q: torch.Tensor,  # [tokens, num_heads, head_dim] float32 or bf16
    k_cache: torch.Tensor,  # [rows, block_size, num_kv_heads, head_dim], contiguous
    v_cache: torch.Tensor,  # same shape and dtype as k_cache
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_of: torch.Tensor,  # [tokens] int32: each token's row of block_tables
    positions: torch.Tensor,  # [tokens] int64: each token's position (it sees keys up to it)
    window: int,
    scale: float,
) -> torch.Tensor:  # [tokens, num_heads, head_dim], q's dtype
    """Attention of each token over keys ``max(0, p - window + 1) .. p`` of its sequence (all
    in the pool already). Callers check ``windowed_attention_supports`` first."""
    lib = load_f32_library()
    assert lib is not None
    tokens, heads, dim = q.shape
    out = torch.empty((tokens, heads, dim), dtype=q.dtype)
    if tokens == 0:
        return out
    tables = block_tables.to(torch.int32).contiguous()
    seq_of = seq_of.to(torch.int32).contiguous()
    positions = positions.to(torch.int64).contiguous()
    lib.wa_windowed_attention(
        q.data_ptr(), int(q.dtype is torch.bfloat16), q.stride(0), q.stride(1),
        k_cache.data_ptr(), v_cache.data_ptr(), int(k_cache.dtype is torch.bfloat16),
        tables.data_ptr(), tables.stride(0), seq_of.data_ptr(), positions.data_ptr(), tokens,
        heads, k_cache.shape[2], dim, k_cache.shape[1], window, scale,
        out.data_ptr(), int(out.dtype is torch.bfloat16), torch.get_num_threads(),
    )  # fmt: skip
    return out
