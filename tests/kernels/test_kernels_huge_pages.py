"""Tensors cut from huge-page-advised mappings (``HugePageArena``): ordinary contiguous tensors
with the values asked for, outliving the arena, in mappings the kernel was told to back with
2 MB pages."""

from __future__ import annotations

import gc
import mmap

import pytest
import torch
from memory_mappings import vm_flags_of

from prefixcache.kernels.cpu import HugePageArena, huge_pages_available
from prefixcache.kernels.cpu.huge_pages import ALIGN, CHUNK_BYTES

needs_huge_pages = pytest.mark.skipif(
    not huge_pages_available(), reason="no transparent huge pages on this machine"
)


@pytest.mark.parametrize("enabled", [True, False])
def test_copies_hold_the_values_aligned_and_contiguous(enabled: bool) -> None:
    arena = HugePageArena(enabled=enabled and huge_pages_available())
    sources = [
        torch.randn(3, 5, dtype=torch.bfloat16),
        torch.arange(7, dtype=torch.int8),
        torch.randn(64, 33).t(),  # not contiguous
        torch.zeros(0, 4),
        torch.tensor(2.5),
    ]
    copies = [arena.copy(source) for source in sources]
    for source, copy in zip(sources, copies, strict=True):
        assert copy.shape == source.shape and copy.dtype == source.dtype
        assert copy.is_contiguous() and torch.equal(copy, source)
        assert copy.numel() == 0 or copy.data_ptr() % ALIGN == 0
    copies[0].fill_(1.0)  # writable, and apart from its neighbours
    assert torch.equal(copies[1], sources[1]) and torch.equal(copies[2], sources[2])


@needs_huge_pages
def test_tensors_outlive_the_arena_and_span_several_chunks() -> None:
    arena = HugePageArena()
    big = arena.empty((CHUNK_BYTES // 4 + 1,), torch.float32)  # more than a chunk alone
    small = [arena.copy(torch.full((1000,), float(i))) for i in range(4)]
    big.fill_(3.0)
    del arena
    gc.collect()
    assert bool((big == 3.0).all())
    for i, tensor in enumerate(small):
        assert bool((tensor == float(i)).all())


@needs_huge_pages
def test_the_mappings_are_advised_for_huge_pages() -> None:
    tensor = HugePageArena().empty((1 << 20,), torch.float32)
    tensor.fill_(1.0)
    assert "hg" in vm_flags_of(tensor.data_ptr())  # MADV_HUGEPAGE
    unadvised = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    plain = torch.frombuffer(unadvised, dtype=torch.float32)
    plain.fill_(1.0)
    assert "hg" not in vm_flags_of(plain.data_ptr())


def test_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXCACHE_HUGE_PAGES", "0")
    assert not huge_pages_available() and not HugePageArena().enabled
