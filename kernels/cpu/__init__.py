"""CPU kernels: C with AVX-512/BF16 intrinsics and OpenMP, compiled with the system gcc at
first use (see ``build``) and called through ctypes. Paged attention (``paged_attention``) and
the decoder's elementwise ops on bf16 (``model_ops``: RMSNorm with the residual add, RoPE,
SiLU-and-mul, KV writes into a bf16 pool), its bf16 projections (``linear``: a GEMM over a
weight packed once; ``greedy_screen``: greedy decoding's argmax from an int8 copy of the output
head; ``huge_pages``: memory for such large operands on 2 MB pages), and all of them chained
into decoder layers, a run of layers per call (``decoder_layer``), whose time per phase
``phase_profile`` measures (against the machine's bf16 peak, ``bf16_dot_peak``).

``cpu_attention_available()`` says whether they can run here (x86-64 Linux, AVX-512 F/BW/VL
and AVX512-BF16, gcc; ``PREFIXCACHE_CPU_KERNELS=0`` turns them off); ``cpu_kernel_supports``
whether a given call qualifies (bf16 queries over a bf16, or a scaled int8 / fp8, pool).
``cpu_model_ops_support`` whether tensors qualify for the elementwise ops (CPU bf16).
A float32 engine's attention, projections and elementwise ops have kernels of their own,
built for AVX2 and FMA only (``paged_attention_f32``: ``f32_attention_available``,
``f32_kernel_supports``; ``linear_f32``: ``f32_linear_supports``, ``pack_f32_weight``;
``model_ops_f32``: ``f32_model_ops_support``, and ``store_kv_f32``), so they run on CPUs
without AVX-512 too; ``f32_fma_peak`` is their ceiling (``peak_rates``).
Otherwise use the references in ``prefixcache.kernels.reference``, which have the same
signatures.
"""

from __future__ import annotations

from prefixcache.kernels.cpu.decoder_layer import (
    LayerWeights,
    PagedStep,
    decoder_layers_cpu,
    fused_layer_supported,
)
from prefixcache.kernels.cpu.greedy_screen import (
    GreedyScreen,
    greedy_screen_available,
    screened_argmax,
)
from prefixcache.kernels.cpu.huge_pages import HugePageArena, huge_pages_available
from prefixcache.kernels.cpu.linear import cpu_linear_supports, linear_cpu
from prefixcache.kernels.cpu.linear_f32 import (
    f32_linear_supports,
    linear_f32,
    pack_f32_weight,
    unpack_f32_weight,
)
from prefixcache.kernels.cpu.model_ops import (
    BlockCopier,
    add_rms_norm_cpu_,
    apply_rotary_cpu_,
    copy_blocks_cpu,
    cpu_model_ops_support,
    rms_norm_cpu,
    silu_and_mul_cpu,
    store_kv_cpu,
)
from prefixcache.kernels.cpu.model_ops_f32 import (
    add_rms_norm_f32_,
    apply_rotary_f32_,
    f32_model_ops_support,
    rms_norm_f32,
    silu_and_mul_f32,
    store_kv_f32,
)
from prefixcache.kernels.cpu.paged_attention import (
    cpu_attention_available,
    cpu_kernel_supports,
    paged_decode_attention_cpu,
    paged_prefill_attention_cpu,
)
from prefixcache.kernels.cpu.paged_attention_f32 import (
    f32_attention_available,
    f32_kernel_supports,
    paged_decode_attention_f32,
    paged_prefill_attention_f32,
)
from prefixcache.kernels.cpu.peak_rates import bf16_dot_peak, f32_fma_peak
from prefixcache.kernels.cpu.phase_profile import PHASES, phase_profile

__all__ = [
    "PHASES",
    "BlockCopier",
    "GreedyScreen",
    "HugePageArena",
    "LayerWeights",
    "PagedStep",
    "add_rms_norm_cpu_",
    "add_rms_norm_f32_",
    "apply_rotary_cpu_",
    "apply_rotary_f32_",
    "bf16_dot_peak",
    "copy_blocks_cpu",
    "cpu_attention_available",
    "cpu_kernel_supports",
    "cpu_linear_supports",
    "cpu_model_ops_support",
    "decoder_layers_cpu",
    "f32_attention_available",
    "f32_fma_peak",
    "f32_kernel_supports",
    "f32_linear_supports",
    "f32_model_ops_support",
    "fused_layer_supported",
    "greedy_screen_available",
    "huge_pages_available",
    "linear_cpu",
    "linear_f32",
    "pack_f32_weight",
    "paged_decode_attention_cpu",
    "paged_decode_attention_f32",
    "paged_prefill_attention_cpu",
    "paged_prefill_attention_f32",
    "phase_profile",
    "rms_norm_cpu",
    "rms_norm_f32",
    "screened_argmax",
    "silu_and_mul_cpu",
    "silu_and_mul_f32",
    "store_kv_cpu",
    "store_kv_f32",
    "unpack_f32_weight",
]
