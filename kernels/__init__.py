"""Paged-attention kernels and the decoder's elementwise ops, with pure-torch references of
the same signatures.

Dispatch (see ``prefixcache.kernels.dispatch``) picks the Triton kernel for CUDA tensors, the
compiled CPU attention kernels (``prefixcache.kernels.cpu``: AVX-512 BF16, bf16 queries over
bf16, int8 or fp8 pools; AVX2/FMA, float32 queries over float32 pools) where they apply on
CPU, and the pure-torch reference elsewhere.
Pools may be quantized (fp8 e4m3 or int8, scaled, see ``prefixcache.kernels.quantization``):
``store_kv`` quantizes, attention dequantizes. The elementwise ops (``rms_norm``,
``add_rms_norm_``, ``apply_rotary_``, ``silu_and_mul``, see ``prefixcache.kernels.model_ops``)
and ``store_kv`` run compiled on bf16 and float32 CPU tensors, in torch elsewhere.
``prefixcache.kernels.cpu`` also holds GEMMs over weights packed once (bf16 ``linear_cpu``,
oracle in ``reference.linear``; float32 ``linear_f32``) and whole decoder layers, bf16 or
float32, a run of them per call (``decoder_layers_cpu``), which the engine calls directly.
Never imports the engine or the integrations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from prefixcache.kernels.dispatch import (
    cpu_kernels,
    get_kernel_backend,
    kernel_backend,
    set_kernel_backend,
    triton_kernels,
    uses_cpu_f32_kernel,
    uses_cpu_kernel,
    uses_triton,
)
from prefixcache.kernels.model_ops import (
    add_rms_norm_,
    apply_rotary_,
    rms_norm,
    silu_and_mul,
    uses_cpu_f32_model_ops,
    uses_cpu_model_ops,
)
from prefixcache.kernels.quantization import KV_CACHE_DTYPES, kv_storage_dtype
from prefixcache.kernels.reference.kv_store import copy_blocks_reference, store_kv_reference
from prefixcache.kernels.reference.paged_attention import (
    paged_decode_attention_reference,
    paged_prefill_attention_reference,
    paged_prefill_attention_sdpa,
)


def _compiled_store_layout(*tensors: torch.Tensor) -> bool:
    """k, v ([tokens, kv_heads, head_dim], unit stride along head_dim) and contiguous 4-D
    pools: what the compiled float32 store takes (other layouts go to the reference)."""
    k, v, k_cache, v_cache = tensors
    rows = all(x.dim() == 3 and (x.numel() == 0 or x.stride(-1) == 1) for x in (k, v))
    return rows and all(c.dim() == 4 and c.is_contiguous() for c in (k_cache, v_cache))


def store_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int; -1 skips the token
    k_scale: torch.Tensor | None = None,  # [], [num_kv_heads] or [num_kv_heads, head_dim]
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write (and for fp8/int8 pools quantize) new k/v into their slots."""
    if uses_triton(k_cache):
        impl = triton_kernels().store_kv_triton
    elif k_scale is None and uses_cpu_model_ops(k, v, k_cache, v_cache):
        impl = cpu_kernels().store_kv_cpu
    elif (
        k_scale is None
        and v_scale is None
        and uses_cpu_f32_model_ops(k, v, k_cache, v_cache)
        and _compiled_store_layout(k, v, k_cache, v_cache)
    ):
        impl = cpu_kernels().store_kv_f32
    else:
        impl = store_kv_reference
    impl(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def copy_blocks(
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    src_dst: torch.Tensor,  # [num_pairs, 2] int64, no destination among the sources
) -> None:
    """Copy whole blocks for copy-on-write."""
    impl = triton_kernels().copy_blocks_triton if uses_triton(k_cache) else copy_blocks_reference
    impl(k_cache, v_cache, src_dst)


def block_copier(
    k_caches: Sequence[torch.Tensor],  # per layer [num_blocks, block_size, kv_heads, head_dim]
    v_caches: Sequence[torch.Tensor],  # per layer [num_blocks, block_size, kv_heads, head_dim]
) -> Callable[..., None]:
    """A function of ``src_dst`` ([num_pairs, 2] int64, no destination among the sources) and
    optionally ``num_tokens`` (per pair: how many leading token slots are needed, None: all)
    that runs ``copy_blocks`` in every layer's pools: on CPU one compiled call for all, which
    copies only the slots asked for; elsewhere whole blocks (a superset)."""
    pools = [*k_caches, *v_caches]
    if (
        get_kernel_backend() == "auto"
        and all(pool.is_cpu and pool.is_contiguous() for pool in pools)
        and cpu_kernels().cpu_attention_available()
    ):
        return cpu_kernels().BlockCopier(pools)

    def per_layer(src_dst: torch.Tensor, num_tokens: Sequence[int | None] | None = None) -> None:
        for k_cache, v_cache in zip(k_caches, v_caches, strict=True):
            copy_blocks(k_cache, v_cache, src_dst)

    return per_layer


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, tokens in cache incl. the current one
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """One query per sequence over its paged KV (its last ``sliding_window`` tokens; scores
    soft-capped by ``softcap``: Triton does both, elsewhere the torch reference)."""
    if uses_triton(q):
        return triton_kernels().paged_decode_attention_triton(
            q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale,
            sliding_window, softcap,
        )  # fmt: skip
    if sliding_window is not None or softcap is not None:
        return paged_decode_attention_reference(q, k_cache, v_cache, block_tables, seq_lens,
                                                scale, k_scale, v_scale, sliding_window,
                                                softcap)  # fmt: skip
    if uses_cpu_kernel(q, k_cache, k_scale):
        impl = cpu_kernels().paged_decode_attention_cpu
    elif uses_cpu_f32_kernel(q, k_cache, k_scale):
        impl = cpu_kernels().paged_decode_attention_f32
    else:
        impl = paged_decode_attention_reference
    return impl(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale)


def paged_prefill_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    implementation: str | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Varlen new tokens: full attention over the paged context, causal over themselves.
    ``implementation="sdpa"`` runs SDPA in the query dtype on CPU tensors (what the kernel
    choice picks where it is measured faster, see ``prefixcache.kernels.cpu.kernel_choice``);
    by default the dispatch rule of ``prefixcache.kernels.dispatch`` applies. A
    ``sliding_window`` layer, or one with soft-capped scores, runs Triton where Triton runs,
    else the torch reference."""
    sdpa = implementation == "sdpa" and not q.is_cuda
    if uses_triton(q) and not sdpa:
        return triton_kernels().paged_prefill_attention_triton(
            q, k, v, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale,
            k_scale, v_scale, sliding_window, softcap,
        )  # fmt: skip
    if sliding_window is not None or softcap is not None:
        return paged_prefill_attention_reference(
            q, k, v, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale,
            k_scale, v_scale, widen=implementation != "sdpa", sliding_window=sliding_window,
            softcap=softcap,
        )  # fmt: skip
    if sdpa:
        impl = paged_prefill_attention_sdpa
    elif uses_cpu_kernel(q, k_cache, k_scale):
        impl = cpu_kernels().paged_prefill_attention_cpu
    elif uses_cpu_f32_kernel(q, k_cache, k_scale):
        impl = cpu_kernels().paged_prefill_attention_f32
    else:
        impl = paged_prefill_attention_reference
    return impl(
        q,
        k,
        v,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        context_lens,
        scale,
        k_scale,
        v_scale,
    )


__all__ = [
    "KV_CACHE_DTYPES",
    "add_rms_norm_",
    "apply_rotary_",
    "block_copier",
    "copy_blocks",
    "get_kernel_backend",
    "kernel_backend",
    "kv_storage_dtype",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "set_kernel_backend",
    "silu_and_mul",
    "store_kv",
]
