"""The decoder's elementwise ops on bf16 CPU tensors through the compiled kernels (``model_ops.c``).

Same signatures and semantics as ``prefixcache.kernels.reference.model_ops``, and the same
roundings: results equal the reference's except, rarely, in the last bf16 bit (the order of
the RMSNorm sum of squares, exp() inside SiLU). ``cpu_model_ops_support`` says when tensors
qualify; callers use the references otherwise. Each op makes one pass over memory, where torch
makes one per elementwise step, and runs on ``torch.get_num_threads()`` OpenMP threads (one for
small tensors). ``BlockCopier`` / ``copy_blocks_cpu`` copy copy-on-write blocks in every
layer's pools at once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from prefixcache.kernels.cpu.build import load_library
from prefixcache.kernels.cpu.tensor_args import store_kv_into


def cpu_model_ops_support(*tensors: torch.Tensor) -> bool:
    """True when every tensor is a CPU bf16 tensor and the compiled kernels run here."""
    for t in tensors:
        if t.dtype is not torch.bfloat16 or not t.is_cpu:
            return False
    return load_library() is not None


def _library():
    lib = load_library()
    if lib is None:
        raise RuntimeError("the compiled CPU kernels are unavailable on this machine")
    return lib


def _check_rows(name: str, x: torch.Tensor, dim: int) -> None:
    if x.dtype is not torch.bfloat16 or not x.is_cpu:
        raise ValueError(f"{name} must be a CPU bfloat16 tensor, got {x.dtype} on {x.device}")
    if x.dim() != dim or (x.numel() and x.stride(-1) != 1):
        raise ValueError(
            f"{name} must be {dim}-D with a contiguous last dimension, got shape "
            f"{tuple(x.shape)} and strides {x.stride()}"
        )


def _check_weight(weight: torch.Tensor, hidden: int) -> None:
    if weight.dtype is not torch.bfloat16 or not weight.is_cpu:
        raise ValueError(f"weight must be a CPU bfloat16 tensor, got {weight.dtype}")
    if weight.shape != (hidden,) or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous [{hidden}], got {tuple(weight.shape)}")


def rms_norm_cpu(
    x: torch.Tensor,  # [num_tokens, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [num_tokens, hidden], new
    """``weight * (x / sqrt(mean(x^2) + eps))``, statistics in float32, output bf16."""
    _check_rows("x", x, 2)
    rows, hidden = x.shape
    _check_weight(weight, hidden)
    out = torch.empty((rows, hidden), dtype=torch.bfloat16)
    if rows:
        _library().pc_rms_norm(
            x.data_ptr(), x.stride(0), None, 0, weight.data_ptr(), out.data_ptr(), hidden,
            rows, hidden, eps, torch.get_num_threads(),
        )  # fmt: skip
    return out


def add_rms_norm_cpu_(
    x: torch.Tensor,  # [num_tokens, hidden], overwritten by the normed sum
    residual: torch.Tensor,  # [num_tokens, hidden], overwritten by x + residual
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # x
    """``residual += x`` (rounded to bf16), then ``x = rms_norm(residual)``, in place; x and
    residual must not overlap."""
    _check_rows("x", x, 2)
    _check_rows("residual", residual, 2)
    rows, hidden = x.shape
    if residual.shape != x.shape:
        raise ValueError(f"residual has shape {tuple(residual.shape)}, x {tuple(x.shape)}")
    _check_weight(weight, hidden)
    if rows:
        _library().pc_rms_norm(
            x.data_ptr(), x.stride(0), residual.data_ptr(), residual.stride(0),
            weight.data_ptr(), x.data_ptr(), x.stride(0), rows, hidden, eps,
            torch.get_num_threads(),
        )  # fmt: skip
    return x


def apply_rotary_cpu_(
    x: torch.Tensor,  # [num_tokens, heads, head_dim], rotated in place
    cos_sin: torch.Tensor,  # [num_tokens, 2, head_dim]: each token's cos row, then sin row
) -> torch.Tensor:  # x
    """RoPE in the rotate-half (GPT-NeoX) layout: ``x = x * cos + rotate_half(x) * sin``, each
    product and the sum rounded to bf16 as torch rounds them."""
    _check_rows("x", x, 3)
    _check_rows("cos_sin", cos_sin, 3)
    tokens, heads, head_dim = x.shape
    if cos_sin.shape != (tokens, 2, head_dim) or cos_sin.stride(1) != head_dim:
        raise ValueError(
            f"cos_sin must be [{tokens}, 2, {head_dim}] with its cos and sin rows adjacent, "
            f"got shape {tuple(cos_sin.shape)}"
        )
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    if x.numel():
        _library().pc_rotary(
            x.data_ptr(), x.stride(0), x.stride(1), cos_sin.data_ptr(), cos_sin.stride(0),
            tokens, heads, head_dim, torch.get_num_threads(),
        )  # fmt: skip
    return x


def silu_and_mul_cpu(
    gate_up: torch.Tensor,  # [num_tokens, 2 * intermediate], gate columns first
) -> torch.Tensor:  # [num_tokens, intermediate], new
    """``silu(gate) * up``, the SiLU rounded to bf16 before the product."""
    _check_rows("gate_up", gate_up, 2)
    rows, width = gate_up.shape
    if width % 2:
        raise ValueError(f"gate_up must have an even number of columns, got {width}")
    out = torch.empty((rows, width // 2), dtype=torch.bfloat16)
    if rows:
        _library().pc_silu_and_mul(
            gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), width // 2, rows, width // 2,
            torch.get_num_threads(),
        )  # fmt: skip
    return out


def store_kv_cpu(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] bf16
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] bf16
    slot_mapping: torch.Tensor,  # [num_tokens] int, slot = block * block_size + offset; -1 skip
    k_scale: torch.Tensor | None = None,  # must be None: a bf16 pool takes no scales
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write token i's k/v into flat slot ``slot_mapping[i]`` of a contiguous bf16 pool; tokens
    with slot -1 are skipped. ValueError (nothing written) for a slot outside the pool."""
    store_kv_into(
        _library().pc_store_kv, k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale,
        torch.bfloat16,
    )


class BlockCopier:
    """Copies blocks, whole or their first token slots, in a fixed set of pools (raw bytes,
    any element type) with one compiled call; the pools are checked once, here. ValueError
    for pools that are not contiguous CPU tensors of one shape and dtype."""

    def __init__(self, pools: Sequence[torch.Tensor]) -> None:  # each [num_blocks, ...]
        if not pools:
            raise ValueError("no pools to copy blocks in")
        first = pools[0]
        for pool in pools:
            if not pool.is_cpu or not pool.is_contiguous() or pool.shape != first.shape or (
                pool.dtype is not first.dtype
            ):
                raise ValueError("pools must be contiguous CPU tensors of one shape and dtype")
        self.pools = list(pools)  # keeps the pointers valid
        self.num_blocks = first.shape[0]
        self.block_bytes = first[0].numel() * first.element_size() if self.num_blocks else 0
        # a token slot: one index of dim 1 ([num_blocks, block_size, ...] pools)
        self.slots = first.shape[1] if first.dim() > 1 else 1
        self._pointers = (ctypes.c_void_p * len(pools))(*(pool.data_ptr() for pool in pools))

    def __call__(
        self,
        src_dst: torch.Tensor,  # [num_pairs, 2] int
        num_tokens: Sequence[int | None] | None = None,  # [num_pairs]: leading slots, None: all
    ) -> None:
        """Copy block ``src_dst[i, 0]`` into ``src_dst[i, 1]`` in every pool, or with
        ``num_tokens[i]`` only its first that many token slots (dim 1 of the pools). No
        destination may be among the sources (the pairs run in order); ValueError, with
        nothing copied, for that, a block id outside the pools or a slot count outside
        [0, slots per block]."""
        if src_dst.numel() == 0:
            return
        pairs = src_dst.to(torch.int64).contiguous()
        if pairs.dim() != 2 or pairs.shape[1] != 2:
            raise ValueError(f"src_dst must be [num_pairs, 2], got {tuple(src_dst.shape)}")
        if set(pairs[:, 1].tolist()) & set(pairs[:, 0].tolist()):
            raise ValueError("a destination block is also a source")
        counts = None
        if num_tokens is not None and any(n is not None for n in num_tokens):
            if len(num_tokens) != pairs.shape[0]:
                raise ValueError(f"{len(num_tokens)} token counts for {pairs.shape[0]} pairs")
            slot_bytes = self.block_bytes // self.slots
            counts = (ctypes.c_int64 * len(num_tokens))(
                *(self.block_bytes if n is None else int(n) * slot_bytes for n in num_tokens)
            )
        status = _library().pc_copy_blocks(
            self._pointers, len(self.pools), self.block_bytes, self.num_blocks,
            pairs.data_ptr(), pairs.shape[0], counts,
        )  # fmt: skip
        if status:
            raise ValueError(
                f"a block id is outside the pools' [0, {self.num_blocks}) or a token count "
                f"outside [0, {self.slots}]"
            )


def copy_blocks_cpu(
    pools: Sequence[torch.Tensor],  # each [num_blocks, ...] contiguous, one shape and dtype
    src_dst: torch.Tensor,  # [num_pairs, 2] int: copy block src_dst[i, 0] into src_dst[i, 1]
) -> None:
    """``BlockCopier(pools)(src_dst)``: blocks copied in every pool with one compiled call."""
    BlockCopier(pools)(src_dst)
