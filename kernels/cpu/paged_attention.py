"""Paged attention on the CPU through the compiled AVX-512/BF16 kernel (``paged_attention.c``).

Same signatures and semantics as ``prefixcache.kernels.reference.paged_attention``, for bf16
queries over a bf16 pool, or over an int8 / fp8 (e4m3fn) pool with float32 scales (shape
``[]``, ``[num_kv_heads]`` or ``[num_kv_heads, head_dim]``). Quantized pool elements are read
as ``stored * scale`` rounded to bf16, the values ``dequantize(stored, scale, torch.bfloat16)``
gives the reference; the new tokens' k/v of a prefill are bf16 and used as they are.
``cpu_kernel_supports`` says when a call qualifies, callers use the reference otherwise.
Outputs are new contiguous tensors. The kernel runs on ``torch.get_num_threads()`` OpenMP
threads of the pool torch itself uses.

Raw data pointers and strides (in elements) go to C; the tensors stay referenced here until
the call returns. The C side keeps one workspace per calling thread (prefill packs each
sequence's K/V there), grown to the largest call and reused; ``release_workspace()`` frees it.
"""

from __future__ import annotations

import torch

from prefixcache.kernels.cpu.build import load_library
from prefixcache.kernels.cpu.tensor_args import head_rows, int32_tensor
from prefixcache.kernels.quantization import FP8_DTYPE, full_scale, is_quantized

ATTENTION_ERRORS = {  # the kernel's negative return codes
    -1: "query_start_loc must be non-decreasing within [0, num_tokens]",
    -2: "lengths must be non-negative",
    -3: "block_tables has fewer columns than the longest sequence needs",
    -4: "a block table entry is outside [0, num_blocks)",
    -5: "out of memory for the kernel workspace",
    -6: "unsupported pool dtype, or a quantized pool without scales",
}
# pool element dtype -> the kernel's kv_type code (KV_BF16, KV_INT8, KV_FP8)
_POOL_TYPES = {torch.bfloat16: 0, torch.int8: 1, FP8_DTYPE: 2}


def cpu_attention_available() -> bool:
    """Whether the compiled kernel can run here (never raises)."""
    return load_library() is not None


def cpu_kernel_supports(
    q: torch.Tensor,  # [tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    k_scale: torch.Tensor | None,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
) -> bool:
    """True when the kernel handles these inputs: CPU bf16 q over a contiguous CPU pool that is
    bf16 without a scale, or int8 / fp8 e4m3fn with a CPU scale of shape [], [num_kv_heads] or
    [num_kv_heads, head_dim]; head_dim a multiple of 32 up to 256, heads a multiple of kv
    heads, and the kernel is available here."""
    if q.dtype is not torch.bfloat16 or k_cache.dtype not in _POOL_TYPES:
        return False
    if not (q.is_cpu and k_cache.is_cpu and q.dim() == 3 and k_cache.dim() == 4):
        return False
    head_dim, num_heads, num_kv_heads = q.shape[2], q.shape[1], k_cache.shape[2]
    if head_dim % 32 or head_dim > 256 or k_cache.shape[3] != head_dim:
        return False
    if num_kv_heads == 0 or num_heads % num_kv_heads or not k_cache.is_contiguous():
        return False
    if is_quantized(k_cache.dtype):
        if k_scale is None or _scale_problem(k_scale, num_kv_heads, head_dim) is not None:
            return False
    elif k_scale is not None:
        return False
    return cpu_attention_available()


def release_workspace() -> None:
    """Free the calling thread's cached kernel workspace (no-op when unavailable)."""
    lib = load_library()
    if lib is not None:
        lib.pa_release_workspace()


def _scale_problem(
    scale: torch.Tensor,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
    num_kv_heads: int,
    head_dim: int,
) -> str | None:
    """Why the kernel cannot take ``scale`` for a quantized pool, or None when it can."""
    if not isinstance(scale, torch.Tensor) or not scale.is_cpu:
        return "must be a CPU tensor"
    if tuple(scale.shape) not in ((), (num_kv_heads,), (num_kv_heads, head_dim)):
        expected = f"[], [{num_kv_heads}] or [{num_kv_heads}, {head_dim}]"
        return f"has shape {tuple(scale.shape)}, expected {expected}"
    return None


def _pool_scales(
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    k_scale: torch.Tensor | None,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
    v_scale: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:  # [num_kv_heads, head_dim] float32 each
    """The scales of a quantized pool expanded to contiguous float32 [num_kv_heads, head_dim]
    (as the reference's ``full_scale`` reads them); (None, None) for a bf16 pool, which takes
    no scales. Raises ValueError for missing, misplaced or misshapen scales."""
    if not is_quantized(k_cache.dtype):
        if k_scale is not None or v_scale is not None:
            raise ValueError("a bf16 pool takes no k/v scales")
        return None, None
    if k_scale is None or v_scale is None:
        raise ValueError(f"a {k_cache.dtype} pool needs k_scale and v_scale")
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    cpu = torch.device("cpu")
    expanded = []
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        problem = _scale_problem(scale, num_kv_heads, head_dim)
        if problem is not None:
            raise ValueError(f"{name} {problem}")
        ready = scale.dtype is torch.float32 and scale.dim() == 2 and scale.is_contiguous()
        expanded.append(scale if ready else full_scale(scale, num_kv_heads, head_dim, cpu))
    return expanded[0], expanded[1]


def _check_pool(
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    num_heads: int,
    head_dim: int,
    scale: float,
) -> None:
    if not (
        k_cache.dtype in _POOL_TYPES
        and v_cache.dtype is k_cache.dtype
        and k_cache.is_cpu
        and v_cache.is_cpu
        and k_cache.dim() == 4
        and v_cache.shape == k_cache.shape
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
    ):
        raise ValueError(
            "k_cache and v_cache must be contiguous CPU tensors of one shape and one dtype, "
            f"bfloat16, int8 or float8_e4m3fn (got {k_cache.dtype} and {v_cache.dtype})"
        )
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim or head_dim % 32 or head_dim > 256:
        raise ValueError(f"head_dim {head_dim} unsupported (a multiple of 32, at most 256)")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} heads are not a multiple of {num_kv_heads} kv heads")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")


def _library():
    lib = load_library()
    if lib is None:
        raise RuntimeError("the CPU attention kernel is unavailable on this machine")
    return lib


def _call(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] (decode: q, unused)
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] (decode: q, unused)
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    scales: tuple[torch.Tensor | None, torch.Tensor | None],  # [num_kv_heads, head_dim] f32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    starts: torch.Tensor | None,  # [num_seqs + 1] int32 (prefill only)
    lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    lib = _library()
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=torch.bfloat16)
    num_seqs = lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    if block_tables.dim() != 2 or block_tables.shape[0] < num_seqs:
        raise ValueError(f"block_tables has shape {tuple(block_tables.shape)}")
    if block_tables.dtype is not torch.int32 or block_tables.stride(1) != 1:
        block_tables = block_tables.to(torch.int32).contiguous()
    block_tables_rows, max_blocks = block_tables.stride(0), block_tables.shape[1]
    num_blocks, block_size, num_kv_heads = k_cache.shape[:3]
    (q_token, q_head, _), (k_token, k_head, _), (v_token, v_head, _) = (
        q.stride(),
        k.stride(),
        v.stride(),
    )
    k_scale, v_scale = (None if s is None else s.data_ptr() for s in scales)
    status = lib.pa_paged_attention(
        q.data_ptr(), q_token, q_head, k.data_ptr(), k_token, k_head,
        v.data_ptr(), v_token, v_head, k_cache.data_ptr(), v_cache.data_ptr(),
        _POOL_TYPES[k_cache.dtype], k_scale, v_scale, num_blocks,
        block_tables.data_ptr(), block_tables_rows, max_blocks,
        None if starts is None else starts.data_ptr(), lens.data_ptr(), num_seqs, num_tokens,
        out.data_ptr(), num_heads, num_kv_heads, head_dim, block_size,
        scale, starts is None, torch.get_num_threads(),
    )  # fmt: skip
    if status:
        raise ValueError(ATTENTION_ERRORS.get(status, f"CPU attention kernel failed ({status})"))
    return out


def paged_prefill_attention_cpu(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim] new tokens of all sequences
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32: cached tokens before the new ones
    scale: float,
    k_scale: torch.Tensor | None = None,  # int8/fp8 pool: [], [num_kv_heads] or [kv, dim]
    v_scale: torch.Tensor | None = None,  # bf16 pool: both None
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Each new token attends to its sequence's whole cached context (read through the block
    table, dequantized for an int8/fp8 pool) and, causally, to the new tokens up to itself
    (read from ``k``/``v``: bf16 even over a quantized pool, and possibly strided views with a
    contiguous last dimension, e.g. slices of a fused qkv tensor). ValueError for a quantized
    pool without both scales, or a bf16 pool with one."""
    num_tokens, num_heads, head_dim = q.shape
    q = head_rows("q", q, (num_tokens, num_heads, head_dim), torch.bfloat16)
    _check_pool(k_cache, v_cache, num_heads, head_dim, scale)
    scales = _pool_scales(k_cache, k_scale, v_scale)
    kv_shape = (num_tokens, k_cache.shape[2], head_dim)
    k, v = head_rows("k", k, kv_shape, torch.bfloat16), head_rows("v", v, kv_shape, torch.bfloat16)
    context_lens = int32_tensor(context_lens)
    query_start_loc = int32_tensor(query_start_loc)
    if query_start_loc.shape[0] != context_lens.shape[0] + 1:
        raise ValueError("query_start_loc must have num_seqs + 1 entries")
    return _call(
        q, k, v, k_cache, v_cache, scales, block_tables, query_start_loc, context_lens, scale
    )


def paged_decode_attention_cpu(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim] one new token per sequence
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32: tokens in cache, including the current one
    scale: float,
    k_scale: torch.Tensor | None = None,  # int8/fp8 pool: [], [num_kv_heads] or [kv, dim]
    v_scale: torch.Tensor | None = None,  # bf16 pool: both None
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Each sequence's single query attends to all of its ``seq_lens`` cached tokens
    (dequantized for an int8/fp8 pool; a sequence of length 0 gets zeros). ValueError for a
    quantized pool without both scales, or a bf16 pool with one."""
    num_seqs, num_heads, head_dim = q.shape
    q = head_rows("q", q, (num_seqs, num_heads, head_dim), torch.bfloat16)
    _check_pool(k_cache, v_cache, num_heads, head_dim, scale)
    scales = _pool_scales(k_cache, k_scale, v_scale)
    seq_lens = int32_tensor(seq_lens)
    if seq_lens.shape[0] != num_seqs:
        raise ValueError(f"seq_lens has {seq_lens.shape[0]} entries for {num_seqs} queries")
    return _call(q, q, q, k_cache, v_cache, scales, block_tables, None, seq_lens, scale)
