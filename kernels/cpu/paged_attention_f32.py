"""Paged attention on the CPU in float32 through the compiled AVX2/FMA kernel
(``paged_attention_f32.c``): the path of a float32 engine, the default on CPUs without native
bf16 dot products (no AVX-512 needed).

Same signatures and semantics as ``prefixcache.kernels.reference.paged_attention``, for
float32 queries over a float32 pool (no scales). ``f32_kernel_supports`` says when a call
qualifies; callers use the reference otherwise. Outputs are new contiguous tensors. The kernel
runs on ``torch.get_num_threads()`` OpenMP threads of the pool torch itself uses. It sums in
another order than SDPA, so outputs match the reference to float32 rounding, not bitwise; a
token's output does not depend on how its sequence was cut into chunks or cached.

Raw data pointers and strides (in elements) go to C; the tensors stay referenced here until
the call returns.
"""

from __future__ import annotations

import torch

from prefixcache.kernels.cpu.build import load_f32_library
from prefixcache.kernels.cpu.tensor_args import head_rows, int32_tensor

MAX_HEAD_DIM = 256
ATTENTION_ERRORS = {  # the kernel's negative return codes
    -1: "query_start_loc must be non-decreasing within [0, num_tokens]",
    -2: "lengths must be non-negative",
    -3: "block_tables has fewer columns than the longest sequence needs",
    -4: "a block table entry is outside [0, num_blocks)",
    -5: "out of memory for the kernel's work list",
}


def f32_attention_available() -> bool:
    """Whether the compiled float32 kernel can run here (never raises)."""
    return load_f32_library() is not None


def f32_kernel_supports(
    q: torch.Tensor,  # [tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    k_scale: torch.Tensor | None,
) -> bool:
    """True when the kernel handles these inputs: CPU float32 q over a contiguous CPU float32
    pool without scales, head_dim a multiple of 8 up to 256, heads a multiple of kv heads, and
    the kernel is available here."""
    if q.dtype is not torch.float32 or k_cache.dtype is not torch.float32 or k_scale is not None:
        return False
    if not (q.is_cpu and k_cache.is_cpu and q.dim() == 3 and k_cache.dim() == 4):
        return False
    head_dim, num_heads, num_kv_heads = q.shape[2], q.shape[1], k_cache.shape[2]
    if head_dim % 8 or head_dim > MAX_HEAD_DIM or k_cache.shape[3] != head_dim:
        return False
    if num_kv_heads == 0 or num_heads % num_kv_heads or not k_cache.is_contiguous():
        return False
    return f32_attention_available()


def _check_pool(
    q: torch.Tensor,  # [tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    scale: float,
) -> None:
    if k_scale is not None or v_scale is not None:
        raise ValueError("a float32 pool takes no k/v scales")
    if not (
        k_cache.dtype is torch.float32
        and v_cache.dtype is torch.float32
        and k_cache.is_cpu
        and v_cache.is_cpu
        and k_cache.dim() == 4
        and v_cache.shape == k_cache.shape
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
    ):
        raise ValueError(
            "k_cache and v_cache must be contiguous CPU float32 tensors of one shape "
            f"(got {k_cache.dtype} and {v_cache.dtype})"
        )
    if q.dim() != 3:
        raise ValueError(f"q must be [tokens, heads, head_dim], got shape {tuple(q.shape)}")
    num_heads, head_dim, num_kv_heads = q.shape[1], q.shape[2], k_cache.shape[2]
    if k_cache.shape[3] != head_dim or head_dim % 8 or head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim} unsupported (a multiple of 8, at most 256)")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} heads are not a multiple of {num_kv_heads} kv heads")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")


def _call(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] (decode: q, unused)
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] (decode: q, unused)
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    starts: torch.Tensor | None,  # [num_seqs + 1] int32 (prefill only)
    lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    lib = load_f32_library()
    if lib is None:
        raise RuntimeError("the float32 CPU attention kernel is unavailable on this machine")
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=torch.float32)
    num_seqs = lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    if block_tables.dim() != 2 or block_tables.shape[0] < num_seqs:
        raise ValueError(f"block_tables has shape {tuple(block_tables.shape)}")
    if block_tables.dtype is not torch.int32 or block_tables.stride(1) != 1:
        block_tables = block_tables.to(torch.int32).contiguous()
    num_blocks, block_size, num_kv_heads = k_cache.shape[:3]
    status = lib.pa_f32_attention(
        q.data_ptr(), q.stride(0), q.stride(1),
        k.data_ptr(), k.stride(0), k.stride(1),
        v.data_ptr(), v.stride(0), v.stride(1),
        k_cache.data_ptr(), v_cache.data_ptr(), num_blocks,
        block_tables.data_ptr(), block_tables.stride(0), block_tables.shape[1],
        None if starts is None else starts.data_ptr(), lens.data_ptr(), num_seqs, num_tokens,
        out.data_ptr(), out.stride(0), out.stride(1),
        num_heads, num_kv_heads, head_dim, block_size,
        scale, torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise ValueError(ATTENTION_ERRORS.get(status, f"attention kernel error {status}"))
    return out


def paged_prefill_attention_f32(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim] float32
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] float32
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] float32
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32: cached tokens before the new ones
    scale: float,
    k_scale: torch.Tensor | None = None,  # must be None (float32 pools are not scaled)
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim] float32
    """Each new token attends to its sequence's whole cached context and, causally, to the new
    tokens up to itself. The new tokens' k/v come from ``k``/``v``, not from the cache."""
    _check_pool(q, k_cache, v_cache, k_scale, v_scale, scale)
    num_tokens, num_heads, head_dim = q.shape
    kv_shape = (num_tokens, k_cache.shape[2], head_dim)
    q = head_rows("q", q, (num_tokens, num_heads, head_dim), torch.float32)
    k, v = head_rows("k", k, kv_shape, torch.float32), head_rows("v", v, kv_shape, torch.float32)
    starts, lens = int32_tensor(query_start_loc), int32_tensor(context_lens)
    if starts.shape != (lens.shape[0] + 1,):
        raise ValueError(
            f"query_start_loc has shape {tuple(starts.shape)}, expected ({lens.shape[0] + 1},)"
        )
    return _call(q, k, v, k_cache, v_cache, block_tables, starts, lens, scale)


def paged_decode_attention_f32(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim] float32, one new token per sequence
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] float32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32: tokens in cache, including the current one
    scale: float,
    k_scale: torch.Tensor | None = None,  # must be None (float32 pools are not scaled)
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim] float32
    """Each sequence's single query attends to all of its ``seq_lens`` cached tokens (a
    sequence with none gets zeros)."""
    _check_pool(q, k_cache, v_cache, k_scale, v_scale, scale)
    q = head_rows("q", q, tuple(q.shape), torch.float32)
    lens = int32_tensor(seq_lens)
    if lens.shape != (q.shape[0],):
        raise ValueError(f"seq_lens has shape {tuple(lens.shape)}, expected ({q.shape[0]},)")
    return _call(q, q, q, k_cache, v_cache, block_tables, None, lens, scale)
