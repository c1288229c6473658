"""Choosing the implementation: Triton for CUDA tensors, the pure-torch reference elsewhere.

The backend is "auto" by default (the rule above). ``PREFIXCACHE_KERNELS=triton|reference``
or ``kernel_backend("triton")`` overrides it; forcing Triton on CPU tensors only works under
``TRITON_INTERPRET=1`` (set before triton is first imported), which is how the tests run the
Triton kernels on a machine without a GPU. Triton is imported lazily, on first use.
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
    """Select "auto" (Triton on CUDA, reference elsewhere), "triton" or "reference"."""
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


def triton_kernels() -> ModuleType:
    """The ``prefixcache.kernels.triton`` package (imports triton on first call)."""
    from prefixcache.kernels import triton as triton_package

    return triton_package
