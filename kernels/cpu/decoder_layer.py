"""A whole decoder layer over a paged bf16 pool in one compiled call (``decoder_layer.c``).

The layer's ops (RMSNorm with the residual add, the QKV projection, RoPE, the KV write, paged
attention, the output projection, the second norm, the SwiGLU MLP) are the compiled kernels of
this package, chained in C: the ~10 Python dispatches a layer otherwise costs (about 0.1 ms per
layer on a 2-core CPU, a quarter of a decode step of a 135M model) become one. Results equal
the separate compiled ops bit for bit.

``PagedStep`` carries one step's attention inputs, ``LayerWeights`` one layer's weights (the
projections packed by ``pack_linear_weight``); ``fused_layer_supported`` says whether a layer
of those shapes can run here. The intermediate activations live in a per-thread scratch buffer,
grown to the largest step and reused; ``release_layer_scratch()`` frees the calling thread's.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from prefixcache.kernels.cpu.build import load_library
from prefixcache.kernels.cpu.paged_attention import ATTENTION_ERRORS

# the attention kernel's codes (it runs inside the layer), and the layer's own
_ERRORS = {**ATTENTION_ERRORS, -7: "slot_mapping has a slot outside the pool"}


@dataclass(frozen=True)
class PagedStep:
    """One step's paged-attention inputs for one layer (CPU, bf16 pool, no scales).

    Rows ``[0, num_decode)`` decode (one per sequence, over ``decode_seq_lens`` cached tokens,
    themselves included); the rest are prefill chunks laid out by ``prefill_query_start_loc``
    (relative to row ``num_decode``) over ``prefill_context_lens`` cached tokens.
    """

    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim] bf16
    v_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim] bf16
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 skips
    num_decode: int
    decode_block_tables: torch.Tensor  # [num_decode, max_blocks] int32
    decode_seq_lens: torch.Tensor  # [num_decode] int32
    prefill_block_tables: torch.Tensor  # [num_prefill, max_blocks] int32
    prefill_query_start_loc: torch.Tensor  # [num_prefill + 1] int32
    prefill_context_lens: torch.Tensor  # [num_prefill] int32
    scale: float


@dataclass(frozen=True)
class LayerWeights:
    """One layer's weights: norms bf16 ``[hidden]``, projections packed (``[ceil(out / 64),
    in / 2, 64, 2]`` bf16, see ``prefixcache.kernels.reference.linear``)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    eps: float
    qkv: torch.Tensor  # out = (heads + 2 kv_heads) * head_dim, in = hidden
    qkv_bias: torch.Tensor | None  # [(heads + 2 kv_heads) * head_dim] bf16
    o: torch.Tensor  # out = hidden, in = heads * head_dim
    gate_up: torch.Tensor  # out = 2 * intermediate, in = hidden (gate rows first)
    down: torch.Tensor  # out = hidden, in = intermediate
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


class _LayerArgs(ctypes.Structure):
    """Mirror of ``layer_args`` in decoder_layer.c (every field 8 bytes)."""

    _fields_ = [
        *((name, ctypes.c_int64) for name in (
            "tokens", "hidden", "heads", "kv_heads", "head_dim", "inter", "block_size",
            "num_blocks", "threads",
        )),
        ("delta", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p),
        ("eps", ctypes.c_double), ("scale", ctypes.c_double),
        *((name, ctypes.c_void_p) for name in ("qkv_w", "qkv_bias", "o_w", "gate_up_w", "down_w")),
        ("cos_sin", ctypes.c_void_p), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p),
        ("slots", ctypes.c_void_p), ("num_decode", ctypes.c_int64),
        ("decode_tables", ctypes.c_void_p), ("decode_tables_stride", ctypes.c_int64),
        ("decode_max_blocks", ctypes.c_int64), ("decode_lens", ctypes.c_void_p),
        ("num_prefill", ctypes.c_int64), ("prefill_tables", ctypes.c_void_p),
        ("prefill_tables_stride", ctypes.c_int64), ("prefill_max_blocks", ctypes.c_int64),
        ("prefill_starts", ctypes.c_void_p), ("prefill_context", ctypes.c_void_p),
    ]  # fmt: skip


def fused_layer_supported(hidden: int, heads: int, kv_heads: int, head_dim: int,
                          intermediate: int) -> bool:
    """Whether a layer of these shapes can run fused here: the compiled attention's head
    shapes (head_dim a multiple of 32 up to 256, heads a multiple of kv_heads), even GEMM
    inputs, and the compiled kernels available."""
    return (
        head_dim % 32 == 0
        and 0 < head_dim <= 256
        and kv_heads > 0
        and heads % kv_heads == 0
        and hidden % 2 == 0
        and intermediate % 2 == 0
        and load_library() is not None
    )


def release_layer_scratch() -> None:
    """Free the calling thread's scratch buffer (no-op when the kernels are unavailable)."""
    lib = load_library()
    if lib is not None:
        lib.pc_release_layer_scratch()


def _rows(name: str, x: torch.Tensor, shape: tuple[int, ...]) -> int:
    if x.dtype is not torch.bfloat16 or not x.is_cpu or x.shape != shape:
        raise ValueError(f"{name} must be CPU bfloat16 {shape}, got {x.dtype} {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return x.data_ptr()


def decoder_layer_cpu(
    delta: torch.Tensor,  # [num_tokens, hidden] bf16: the previous block's output
    residual: torch.Tensor | None,  # [num_tokens, hidden] bf16, updated; None: first layer
    cos_sin: torch.Tensor,  # [num_tokens, 2, head_dim] bf16
    weights: LayerWeights,
    step: PagedStep,
) -> tuple[torch.Tensor, torch.Tensor]:  # (mlp_out, residual), each [num_tokens, hidden]
    """The layer's MLP output and the residual stream before it is added. ``residual`` is
    updated in place; for the first layer (``residual`` None) ``delta`` becomes the stream.
    The new tokens' k/v are written into ``step``'s pool. ValueError for bad slots or tables
    (the pool may then hold this layer's new k/v)."""
    tokens, hidden = delta.shape
    w = weights
    args = _LayerArgs(
        tokens=tokens, hidden=hidden, heads=w.heads, kv_heads=w.kv_heads, head_dim=w.head_dim,
        inter=w.intermediate, block_size=step.k_cache.shape[1],
        num_blocks=step.k_cache.shape[0], threads=torch.get_num_threads(),
    )  # fmt: skip
    args.delta = _rows("delta", delta, (tokens, hidden))
    if residual is not None:
        args.residual = _rows("residual", residual, (tokens, hidden))
    out = torch.empty((tokens, hidden), dtype=torch.bfloat16)
    args.out = out.data_ptr()
    args.cos_sin = _rows("cos_sin", cos_sin, (tokens, 2, w.head_dim))
    pool_shape = (step.k_cache.shape[0], step.k_cache.shape[1], w.kv_heads, w.head_dim)
    args.k_cache = _rows("k_cache", step.k_cache, pool_shape)
    args.v_cache = _rows("v_cache", step.v_cache, pool_shape)
    args.input_norm, args.post_norm = w.input_norm.data_ptr(), w.post_norm.data_ptr()
    args.eps, args.scale = w.eps, step.scale
    args.qkv_w, args.o_w = w.qkv.data_ptr(), w.o.data_ptr()
    args.gate_up_w, args.down_w = w.gate_up.data_ptr(), w.down.data_ptr()
    if w.qkv_bias is not None:
        args.qkv_bias = w.qkv_bias.data_ptr()
    if step.slot_mapping.shape != (tokens,) or step.slot_mapping.dtype is not torch.int64:
        raise ValueError("slot_mapping must be int64 [num_tokens]")
    args.slots = step.slot_mapping.data_ptr()
    args.num_decode = step.num_decode
    tables = step.decode_block_tables
    args.decode_tables, args.decode_tables_stride = tables.data_ptr(), tables.stride(0)
    args.decode_max_blocks, args.decode_lens = tables.shape[1], step.decode_seq_lens.data_ptr()
    tables = step.prefill_block_tables
    args.num_prefill = step.prefill_context_lens.shape[0]
    args.prefill_tables, args.prefill_tables_stride = tables.data_ptr(), tables.stride(0)
    args.prefill_max_blocks = tables.shape[1]
    args.prefill_starts = step.prefill_query_start_loc.data_ptr()
    args.prefill_context = step.prefill_context_lens.data_ptr()
    lib = load_library()
    if lib is None:
        raise RuntimeError("the compiled CPU kernels are unavailable on this machine")
    status = lib.pc_decoder_layer(ctypes.addressof(args))
    if status:
        raise ValueError(_ERRORS.get(status, f"the fused decoder layer failed ({status})"))
    return out, delta if residual is None else residual
