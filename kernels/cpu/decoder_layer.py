"""Whole decoder layers over a paged pool in one compiled call: bf16 (``decoder_layer.c``, the
AVX-512 library) or float32 (``decoder_layer_f32.c``, the AVX2/FMA library).

The layer's ops (RMSNorm with the residual add, the QKV projection, RoPE, the KV write, paged
attention, the output projection, the second norm, the SwiGLU MLP) are the compiled kernels of
this package, chained in C: the ~10 Python dispatches a layer otherwise costs (about 0.1 ms per
layer on a 2-core CPU, a quarter of a decode step of a 135M model) become one. Results equal
the separate compiled ops bit for bit. The run's dtype is its inputs': bf16 layers call the
bf16 library, float32 ones the float32 library, with the same arguments.

``PagedStep`` carries one step's attention inputs (checked once, shared by every layer),
``LayerWeights`` one layer's weights (the projections packed by ``pack_linear_weight``);
``fused_layer_supported`` says whether a layer of those shapes can run here. The per-layer
arguments (weights, pools) are built and checked once and reused while the layers and pools
stay the same objects; a call fills only the fields the layers share, which C copies into each
layer's (a Python loop over the layers cost ~0.3 ms a step). The intermediate
activations live in a per-thread scratch buffer, grown to the largest step and reused;
``release_layer_scratch()`` frees the calling thread's.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from prefixcache.kernels.cpu.build import load_f32_library, load_library
from prefixcache.kernels.cpu.paged_attention import ATTENTION_ERRORS
from prefixcache.kernels.cpu.paged_attention_f32 import ATTENTION_ERRORS as F32_ATTENTION_ERRORS
from prefixcache.kernels.cpu.window_step import WindowStep
from prefixcache.kernels.cpu.windowed_attention import windowed_shape_supported

# per run dtype: the attention kernel's codes (it runs inside the layer), and the layer's own
_SLOT_ERROR = {-7: "slot_mapping has a slot outside the pool"}
_ERRORS = {
    torch.bfloat16: {**ATTENTION_ERRORS, **_SLOT_ERROR},
    torch.float32: {**F32_ATTENTION_ERRORS, **_SLOT_ERROR},
}
FUSED_DTYPES = tuple(_ERRORS)


@dataclass(frozen=True)
class PagedStep:
    """One step's paged-attention inputs, the same for every layer (CPU, bf16 or float32 pools).

    Rows ``[0, num_decode)`` decode (one per sequence, over ``decode_seq_lens`` cached tokens,
    themselves included); the rest are prefill chunks laid out by ``prefill_query_start_loc``
    (relative to row ``num_decode``) over ``prefill_context_lens`` cached tokens. The rows
    ``sample_rows`` sample a token; each sees ``sample_seq_lens`` keys through its row of
    ``sample_block_tables``. ``window``: what the sliding layers read and write instead (None
    when no layer of the run slides).
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 skips
    num_decode: int
    decode_block_tables: torch.Tensor  # [num_decode, max_blocks] int32
    decode_seq_lens: torch.Tensor  # [num_decode] int32
    prefill_block_tables: torch.Tensor  # [num_prefill, max_blocks] int32
    prefill_query_start_loc: torch.Tensor  # [num_prefill + 1] int32
    prefill_context_lens: torch.Tensor  # [num_prefill] int32
    scale: float
    sample_rows: torch.Tensor  # [num_sampled] int64, ascending
    sample_block_tables: torch.Tensor  # [num_sampled, max_blocks] int32
    sample_seq_lens: torch.Tensor  # [num_sampled] int32
    window: WindowStep | None = None

    @functools.cached_property
    def _args(self) -> _LayerArgs:
        """A ``layer_args`` holding the step's fields (its tail from ``slots`` on, and
        ``scale``), checked once; each call copies it and adds its own (`decoder_layers_cpu`)."""
        if self.slot_mapping.dtype is not torch.int64 or self.slot_mapping.dim() != 1:
            raise ValueError("slot_mapping must be int64 [num_tokens]")
        if self.sample_rows.dtype is not torch.int64 or self.sample_rows.dim() != 1:
            raise ValueError("sample_rows must be int64 [num_sampled]")
        tensors = (
            self.slot_mapping, self.sample_rows, self.decode_block_tables, self.decode_seq_lens,
            self.prefill_block_tables, self.prefill_query_start_loc, self.prefill_context_lens,
            self.sample_block_tables, self.sample_seq_lens,
        )  # fmt: skip
        if not all(t.is_cpu and t.is_contiguous() for t in tensors) or any(
            t.dtype is not torch.int32 for t in tensors[2:]
        ):
            raise ValueError("step tables must be contiguous CPU int32 tensors")
        decode, prefill = self.decode_block_tables, self.prefill_block_tables
        sample = self.sample_block_tables
        return _LayerArgs(
            slots=self.slot_mapping.data_ptr(), num_decode=self.num_decode,
            decode_tables=decode.data_ptr(), decode_tables_stride=decode.stride(0),
            decode_max_blocks=decode.shape[1], decode_lens=self.decode_seq_lens.data_ptr(),
            num_prefill=self.prefill_context_lens.shape[0],
            prefill_tables=prefill.data_ptr(), prefill_tables_stride=prefill.stride(0),
            prefill_max_blocks=prefill.shape[1],
            prefill_starts=self.prefill_query_start_loc.data_ptr(),
            prefill_context=self.prefill_context_lens.data_ptr(), scale=self.scale,
            num_out=-1, out_rows=self.sample_rows.data_ptr(),
            out_tables=sample.data_ptr(), out_tables_stride=sample.stride(0),
            out_max_blocks=sample.shape[1], out_lens=self.sample_seq_lens.data_ptr(),
            win=None if self.window is None else ctypes.addressof(self.window.args),
        )  # fmt: skip


@dataclass(frozen=True)
class LayerWeights:
    """One layer's weights, all of one dtype: norms ``[hidden]``, projections packed for that
    dtype's GEMM (bf16 ``[ceil(out / 64), in / 2, 64, 2]``, see
    ``prefixcache.kernels.reference.linear``; float32 ``[ceil(out / 16), in, 16]``, see
    ``pack_f32_weight``)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    eps: float
    qkv: torch.Tensor  # out = (heads + 2 kv_heads) * head_dim, in = hidden
    qkv_bias: torch.Tensor | None  # [(heads + 2 kv_heads) * head_dim], the norms' dtype
    o: torch.Tensor  # out = hidden, in = heads * head_dim
    gate_up: torch.Tensor  # out = 2 * intermediate, in = hidden (gate rows first)
    down: torch.Tensor  # out = hidden, in = intermediate
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    @functools.cached_property
    def _args(self) -> _LayerArgs:
        """A ``layer_args`` holding this layer's weights and shapes, copied by every call."""
        args = _LayerArgs(
            hidden=self.input_norm.shape[0], heads=self.heads, kv_heads=self.kv_heads,
            head_dim=self.head_dim, inter=self.intermediate,
            input_norm=self.input_norm.data_ptr(), post_norm=self.post_norm.data_ptr(),
            eps=self.eps, qkv_w=self.qkv.data_ptr(), o_w=self.o.data_ptr(),
            gate_up_w=self.gate_up.data_ptr(), down_w=self.down.data_ptr(),
        )  # fmt: skip
        if self.qkv_bias is not None:
            args.qkv_bias = self.qkv_bias.data_ptr()
        return args


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
        ("window", ctypes.c_int64), ("slots", ctypes.c_void_p), ("num_decode", ctypes.c_int64),
        ("decode_tables", ctypes.c_void_p), ("decode_tables_stride", ctypes.c_int64),
        ("decode_max_blocks", ctypes.c_int64), ("decode_lens", ctypes.c_void_p),
        ("num_prefill", ctypes.c_int64), ("prefill_tables", ctypes.c_void_p),
        ("prefill_tables_stride", ctypes.c_int64), ("prefill_max_blocks", ctypes.c_int64),
        ("prefill_starts", ctypes.c_void_p), ("prefill_context", ctypes.c_void_p),
        ("num_out", ctypes.c_int64), ("out_rows", ctypes.c_void_p),
        ("out_tables", ctypes.c_void_p), ("out_tables_stride", ctypes.c_int64),
        ("out_max_blocks", ctypes.c_int64), ("out_lens", ctypes.c_void_p),
        ("final_norm", ctypes.c_void_p), ("final_eps", ctypes.c_double),
        ("win", ctypes.c_void_p),
    ]  # fmt: skip


class _PreparedLayers:
    """The per-layer ``layer_args`` of a run (weights, shapes, pools, windows), the same from
    step to step: built and checked once, then reused while the layers and pools are the same
    objects at the same addresses. Holds weak references only, so it never keeps a model
    alive."""

    def __init__(
        self,
        layers: Sequence[LayerWeights],
        k_caches: Sequence[torch.Tensor],
        v_caches: Sequence[torch.Tensor],
        windows: tuple[int, ...],
    ) -> None:
        self.args = (_LayerArgs * len(layers))()
        self.windows = windows
        for i, (weights, k_cache, v_cache) in enumerate(
            zip(layers, k_caches, v_caches, strict=True)
        ):
            layer = self.args[i]
            ctypes.pointer(layer)[0] = weights._args
            pool_shape = (k_cache.shape[0], k_cache.shape[1], weights.kv_heads, weights.head_dim)
            dtype = weights.input_norm.dtype
            layer.k_cache = _rows("k_cache", k_cache, pool_shape, dtype)
            layer.v_cache = _rows("v_cache", v_cache, pool_shape, dtype)
            layer.block_size, layer.num_blocks = pool_shape[1], pool_shape[0]
            layer.window = windows[i]
            if windows[i] and not windowed_shape_supported(
                weights.heads, weights.kv_heads, weights.head_dim
            ):
                raise ValueError(f"layer {i}: the windowed kernel does not take its heads")
        self._refs = [weakref.ref(x) for x in (*layers, *k_caches, *v_caches)]
        self._pools = list(map(torch.Tensor.data_ptr, (*k_caches, *v_caches)))

    def fits(
        self,
        layers: Sequence[LayerWeights],
        k_caches: Sequence[torch.Tensor],
        v_caches: Sequence[torch.Tensor],
        windows: tuple[int, ...],
    ) -> bool:
        objects = (*layers, *k_caches, *v_caches)
        return (
            windows == self.windows
            and len(objects) == len(self._refs)
            and all(ref() is obj for ref, obj in zip(self._refs, objects, strict=True))
            and list(map(torch.Tensor.data_ptr, (*k_caches, *v_caches))) == self._pools
        )


_last_prepared: _PreparedLayers | None = None  # the most recent run's


def _prepared_layers(
    layers: Sequence[LayerWeights],
    k_caches: Sequence[torch.Tensor],
    v_caches: Sequence[torch.Tensor],
    windows: tuple[int, ...],
) -> _PreparedLayers:
    global _last_prepared
    prepared = _last_prepared
    if prepared is None or not prepared.fits(layers, k_caches, v_caches, windows):
        prepared = _PreparedLayers(layers, k_caches, v_caches, windows)
        _last_prepared = prepared
    return prepared


# per dtype: head_dim a multiple of, hidden and intermediate multiples of, the library loader
_FUSED_SHAPES = {
    torch.bfloat16: (32, 2, load_library),
    torch.float32: (16, 8, load_f32_library),
}


def fused_layer_supported(hidden: int, heads: int, kv_heads: int, head_dim: int,
                          intermediate: int, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether a layer of these shapes and ``dtype`` can run fused here: the compiled
    attention's head shapes (heads a multiple of kv_heads, head_dim up to 256 and a multiple
    of 32 in bf16, of 16 in float32), the GEMM's and elementwise ops' widths (even in bf16,
    multiples of 8 in float32), and that dtype's compiled kernels available."""
    if dtype not in _FUSED_SHAPES or kv_heads <= 0 or heads % kv_heads:
        return False
    head_multiple, width_multiple, load = _FUSED_SHAPES[dtype]
    return (
        0 < head_dim <= 256
        and head_dim % head_multiple == 0
        and hidden % width_multiple == 0
        and intermediate % width_multiple == 0
        and load() is not None
    )


def release_layer_scratch() -> None:
    """Free the calling thread's scratch buffers (of the libraries that are loaded here)."""
    lib, f32_lib = load_library(), load_f32_library()
    if lib is not None:
        lib.pc_release_layer_scratch()
    if f32_lib is not None:
        f32_lib.pc_f32_release_layer_scratch()


def _rows(name: str, x: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> int:
    if x.dtype is not dtype or not x.is_cpu or x.shape != shape:
        raise ValueError(f"{name} must be CPU {dtype} {shape}, got {x.dtype} {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return x.data_ptr()


def decoder_layers_cpu(
    delta: torch.Tensor,  # [num_tokens, hidden] bf16/f32: the previous block's output (consumed)
    residual: torch.Tensor | None,  # [num_tokens, hidden] delta's dtype, updated; None: first
    cos_sin: torch.Tensor,  # [num_tokens, 2, head_dim] delta's dtype
    layers: Sequence[LayerWeights],
    step: PagedStep,
    k_caches: Sequence[torch.Tensor],  # each [num_blocks, block_size, num_kv_heads, head_dim]
    v_caches: Sequence[torch.Tensor],  # each [num_blocks, block_size, num_kv_heads, head_dim]
    sampled_rows_only: bool = False,
    final_norm: tuple[torch.Tensor, float] | None = None,  # ([hidden] weight, eps)
    windows: Sequence[int | None] | None = None,  # per layer: its sliding window, or None
) -> tuple[torch.Tensor, torch.Tensor]:  # (mlp_out, residual), each [num_tokens or R, hidden]
    """Decoder layers ``layers[i]`` over pools ``k_caches[i]`` / ``v_caches[i]``, one after the
    other in one compiled call: the last layer's MLP output and the residual stream before it
    is added. ``residual`` is updated in place; without one (the model's first layer)
    ``delta`` becomes the stream. The new tokens' k/v are written into every layer's pool.
    With ``sampled_rows_only`` the last layer goes on past its KV write for ``step.sample_rows``
    alone, and both results have one row per sampled row. With ``final_norm`` the same call
    then adds the MLP output to the stream and normalizes it (the model's last norm, as
    ``add_rms_norm_``): the first result is the normed hidden state, the second the stream
    after the add. A layer with a window in ``windows`` slides: its rows attend to their last
    ``window`` keys through ``step.window`` (its slot mapping and tables, the compiled windowed
    kernel). ValueError for bad inputs, slots or tables (the pools up to the failing
    layer may then hold the new k/v). Every tensor is of delta's dtype, bf16 or float32."""
    count = len(layers)
    if count == 0 or len(k_caches) != count or len(v_caches) != count:
        raise ValueError("need one K and one V pool per layer, and at least one layer")
    sliding = tuple(w or 0 for w in windows) if windows is not None else (0,) * count
    if len(sliding) != count or min(sliding) < 0:
        raise ValueError("need one window (None or a positive number) per layer")
    if any(sliding) and step.window is None:
        raise ValueError("sliding layers need the step's window inputs (PagedStep.window)")
    dtype = delta.dtype
    if dtype not in FUSED_DTYPES:
        raise ValueError(f"fused layers run in bfloat16 or float32, not {dtype}")
    if any(weights.input_norm.dtype is not dtype for weights in layers):
        raise ValueError(f"every layer's weights must be {dtype}, as delta is")
    tokens, hidden = delta.shape
    delta_ptr = _rows("delta", delta, (tokens, hidden), dtype)
    stream = (
        _rows("residual", residual, (tokens, hidden), dtype) if residual is not None else None
    )
    cos_sin_ptr = _rows("cos_sin", cos_sin, (tokens, 2, layers[0].head_dim), dtype)
    if step.slot_mapping.shape[0] != tokens or (
        step.window is not None and step.window.positions.shape[0] != tokens
    ):
        raise ValueError("slot_mapping must be int64 [num_tokens]")
    prepared = _prepared_layers(layers, k_caches, v_caches, sliding)
    out = torch.empty((tokens, hidden), dtype=dtype)
    call = _LayerArgs()  # the fields every layer shares (pc_decoder_layers)
    ctypes.pointer(call)[0] = step._args
    call.tokens, call.threads, call.cos_sin = tokens, torch.get_num_threads(), cos_sin_ptr
    call.delta, call.residual, call.out = delta_ptr, stream, out.data_ptr()
    sampled = step.sample_rows.shape[0]
    if sampled_rows_only:
        rows = step.sample_rows
        if sampled and (
            int(rows[0]) < 0 or int(rows[-1]) >= tokens or bool((rows[1:] <= rows[:-1]).any())
        ):
            raise ValueError(f"sample_rows must be ascending rows of the {tokens} tokens")
        call.num_out = sampled
    if final_norm is not None:
        weight, eps = final_norm
        call.final_norm = _rows("final_norm", weight, (hidden,), dtype)
        call.final_eps = eps
    lib = load_library() if dtype is torch.bfloat16 else load_f32_library()
    if lib is None:
        raise RuntimeError(f"the compiled {dtype} CPU kernels are unavailable on this machine")
    run = lib.pc_decoder_layers if dtype is torch.bfloat16 else lib.pc_f32_decoder_layers
    failed = ctypes.c_int64(-1)
    status = run(prepared.args, count, ctypes.byref(call), ctypes.byref(failed))
    if status:
        message = _ERRORS[dtype].get(status, f"the fused decoder layer failed ({status})")
        raise ValueError(f"{message} (layer {failed.value} of the run)")
    stream_tensor = delta if residual is None else residual
    if sampled_rows_only:
        return out[:sampled], stream_tensor[:sampled]
    return out, stream_tensor
