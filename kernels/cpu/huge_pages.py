"""Memory for the CPU kernels' large read-only operands (packed weights, the greedy screen's
int8 head) that the kernel may back with 2 MB pages.

A forward pass streams every weight once: with 4 KB pages SmolLM2's 270 MB of packed weights
span 66,000 pages, a TLB miss and a page walk each, on top of the loads. Anonymous mappings
advised with ``MADV_HUGEPAGE`` get 2 MB pages when first written, wherever Linux's transparent
huge pages are in "madvise" or "always" mode (no system setting changes). ``HugePageArena``
hands out tensors from such mappings: bump allocation, 64-byte aligned, from chunks of at least
``CHUNK_BYTES`` (only the pages written take memory). A chunk is unmapped once the last tensor
cut from it is gone. Where huge pages are unavailable, or with ``PREFIXCACHE_HUGE_PAGES=0``,
the arena hands out ordinary tensors.

The KV pool stays on ordinary pages: zeroing a pool of 2 MB pages at load took about a second
longer, and no warm request measured faster for it.
"""

from __future__ import annotations

import mmap
import os
import platform
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
CHUNK_BYTES = 64 << 20  # a chunk's size at least: few mappings, untouched pages cost nothing
ALIGN = 64  # bytes: a cache line, what the kernels' aligned loads need at most
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_available() -> bool:
    """True on Linux with transparent huge pages not "never", ``mmap.MADV_HUGEPAGE`` known to
    Python, and ``PREFIXCACHE_HUGE_PAGES`` not 0/false/off/no."""
    if os.environ.get("PREFIXCACHE_HUGE_PAGES", "1").strip().lower() in ("0", "false", "off", "no"):
        return False
    if platform.system() != "Linux" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[never]" not in THP_MODE.read_text()
    except OSError:
        return False


class HugePageArena:
    """Tensors cut from huge-page-advised anonymous mappings (see the module docstring).

    ``empty`` and ``copy`` return contiguous CPU tensors starting on a 64-byte boundary; they
    keep their chunk mapped, the arena only keeps the chunk it is filling. Not thread-safe."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = huge_pages_available() if enabled is None else enabled
        self._chunk: torch.Tensor | None = None  # [bytes] uint8 over the current mapping
        self._used = 0  # bytes of the current chunk handed out

    def empty(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialized contiguous tensor of ``shape`` and ``dtype``."""
        shape = tuple(shape)
        if not self.enabled:
            return torch.empty(shape, dtype=dtype)
        count = 1
        for size in shape:
            count *= size
        nbytes = count * dtype.itemsize
        start = -(-self._used // ALIGN) * ALIGN
        if self._chunk is None or start + nbytes > self._chunk.numel():
            self._chunk, start = _map_chunk(max(nbytes, CHUNK_BYTES)), 0
        self._used = start + nbytes
        return self._chunk[start : start + nbytes].view(dtype).view(shape)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of the CPU tensor ``tensor`` (same shape, dtype and values)."""
        out = self.empty(tensor.shape, tensor.dtype)
        out.copy_(tensor)
        return out


def _map_chunk(nbytes: int) -> torch.Tensor:  # [>= nbytes] uint8, starting on a 2 MB boundary
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE  # room to align the start
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # holds the mapping alive
    skip = -whole.data_ptr() % HUGE_PAGE
    return whole[skip : skip + size - HUGE_PAGE]
