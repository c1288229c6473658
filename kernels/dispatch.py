"""Choosing the implementation: Triton for CUDA tensors; on CPU the compiled attention kernels
where they apply (bf16 queries over a bf16, int8 or fp8 pool on an AVX512-BF16 CPU; float32
queries over a float32 pool on an AVX2/FMA CPU; see ``prefixcache.kernels.cpu``) and the
pure-torch reference elsewhere.

The backend is "auto" by default (the rule above). ``PREFIXCACHE_KERNELS=triton|reference``
or ``kernel_backend("triton")`` overrides it ("reference": the pure-torch path everywhere).
Forcing Triton on CPU tensors only works under ``TRITON_INTERPRET=1`` (set before triton is
first imported), which is how the tests run the Triton kernels on a machine without a GPU.
Triton is imported lazily, on first use.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import torch

BACKENDS = ("auto", "triton", "reference")
_backend = os.environ.get("PREFIXCACHE_KERNELS", "auto")
if _backend not in BACKENDS:
    raise ValueError(f"PREFIXCACHE_KERNELS={_backend!r}; choose from {BACKENDS}")


def get_kernel_backend() -> str:
    """The current backend name: "auto", "triton" or "reference"."""
    return _backend


def set_kernel_backend(backend: str) -> None:
    """Select "auto" (Triton on CUDA, the CPU kernel or reference elsewhere), "triton" or
    "reference"."""
    global _backend
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; choose from {BACKENDS}")
    _backend = backend


@contextmanager
def kernel_backend(backend: str) -> Iterator[None]:
    """Use ``backend`` inside the ``with`` block, then restore the previous one."""
    previous = _backend
    set_kernel_backend(backend)
    try:
        yield
    finally:
        set_kernel_backend(previous)


def uses_triton(tensor: torch.Tensor) -> bool:
    """Whether a kernel on ``tensor`` runs the Triton implementation."""
    if _backend == "auto":
        return tensor.is_cuda
    return _backend == "triton"


def uses_cpu_kernel(
    q: torch.Tensor,  # [tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    k_scale: torch.Tensor | None,
) -> bool:
    """Whether attention on these inputs runs the compiled CPU kernel ("auto" only)."""
    return _backend == "auto" and not q.is_cuda and cpu_kernels().cpu_kernel_supports(
        q, k_cache, k_scale
    )


def uses_cpu_f32_kernel(
    q: torch.Tensor,  # [tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    k_scale: torch.Tensor | None,
) -> bool:
    """Whether attention on these inputs runs the compiled float32 CPU kernel ("auto" only)."""
    return _backend == "auto" and not q.is_cuda and cpu_kernels().f32_kernel_supports(
        q, k_cache, k_scale
    )


def cpu_kernels() -> ModuleType:
    """The ``prefixcache.kernels.cpu`` package (compiles its library on first use)."""
    global _cpu_package
    if _cpu_package is None:
        from prefixcache.kernels import cpu as cpu_package

        _cpu_package = cpu_package
    return _cpu_package


_cpu_package: ModuleType | None = None  # imported on first use (every dispatch asks for it)


def triton_kernels() -> ModuleType:
    """The ``prefixcache.kernels.triton`` package (imports triton on first call)."""
    from prefixcache.kernels import triton as triton_package

    return triton_package
