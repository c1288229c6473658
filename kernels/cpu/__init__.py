"""CPU paged-attention kernels: C with AVX-512/BF16 intrinsics and OpenMP, compiled with the
system gcc at first use (see ``build``) and called through ctypes.

``cpu_attention_available()`` says whether they can run here (x86-64 Linux, AVX-512 F/BW/VL
and AVX512-BF16, gcc; ``PREFIXCACHE_CPU_KERNELS=0`` turns them off); ``cpu_kernel_supports``
whether a given call qualifies (bf16 queries over a bf16, or a scaled int8 / fp8, pool).
Otherwise use the references in ``prefixcache.kernels.reference.paged_attention``, which have
the same signatures.
"""

from __future__ import annotations

from prefixcache.kernels.cpu.paged_attention import (
    cpu_attention_available,
    cpu_kernel_supports,
    paged_decode_attention_cpu,
    paged_prefill_attention_cpu,
)

__all__ = [
    "cpu_attention_available",
    "cpu_kernel_supports",
    "paged_decode_attention_cpu",
    "paged_prefill_attention_cpu",
]
