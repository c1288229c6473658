"""Default compute dtype for the CPU forward pass."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

# CPU flags with native bfloat16 dot products (x86: AVX-512 BF16 or AMX).
_NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """True when /proc/cpuinfo lists a native bf16 matmul instruction set (Linux x86)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return not _NATIVE_BF16_FLAGS.isdisjoint(line.split(":", 1)[-1].split())
    return False


def default_cpu_dtype() -> torch.dtype:
    """bfloat16 on CPUs with native bf16 matmuls, else float32.

    Measured with benchmarks/model_forward.py on a 2-core AMD EPYC (AVX-512 BF16), torch
    threads = 2, SmolLM2-135M: a 1,637-token prefill takes 1.99 s in bfloat16 vs 2.78 s in
    float32 (matmuls ~200 vs ~86 GFLOP/s per core; attention costs the same in both), and
    single-token decode, bound by reading the weights, 38 ms vs 61 ms. Without native bf16
    the conversions make bfloat16 matmuls slower than float32.
    """
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
