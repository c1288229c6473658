"""Reusable staging buffers for blocks read from a lower tier on their way into the pool.

A fetch fills rows of a buffer (on a reader thread) and hands them out as payloads; the runner
copies them into the pool a step later and drops them. Writing a fresh 94 MB buffer (a 4K-token
prefix of SmolLM2) faulted in 23,000 pages first: ~40 ms, more than reading the records from the
page cache. A buffer whose rows are all gone is kept and lent again, so a steady stream of loads
touches memory the process already has.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import numpy as np
import torch

ROW_GRANULE = 64  # buffers hold a multiple of this many rows


class StagingRows:
    """Buffers of ``width``-byte rows; at most ``keep_bytes`` of idle buffers are kept.
    ``allocate(rows, width)`` makes a new one's memory (a page-aligned one for ``O_DIRECT``
    reads, say); plain ``torch.empty`` by default."""

    def __init__(self, width: int, keep_bytes: int = 512 << 20,
                 allocate: Callable[[int, int], np.ndarray] | None = None) -> None:  # fmt: skip
        self.width = width
        self._allocate = allocate
        self.keep_bytes = keep_bytes
        self._lock = threading.Lock()
        self._idle: list[torch.Tensor] = []  # [rows, width] uint8 each
        self._lent: dict[int, tuple[torch.Tensor, int]] = {}  # id -> (buffer, rows still out)
        self.allocated = 0  # buffers made (a reused one is not counted again)

    def take(self, count: int) -> torch.Tensor:  # [>= count, width] uint8
        """A buffer of at least ``count`` rows, idle until ``lend`` hands rows of it out."""
        with self._lock:
            fits = [b for b in self._idle if b.shape[0] >= count]
            if fits:
                buffer = min(fits, key=lambda b: b.shape[0])
                self._idle.remove(buffer)
                return buffer
        self.allocated += 1
        rows = -(-max(count, 1) // ROW_GRANULE) * ROW_GRANULE
        if self._allocate is None:
            return torch.empty((rows, self.width), dtype=torch.uint8)
        return torch.from_numpy(self._allocate(rows, self.width))

    def lend(self, buffer: torch.Tensor, count: int,
             width: int | None = None) -> list[torch.Tensor]:  # fmt: skip
        """The first ``width`` bytes (all by default) of the first ``count`` rows of
        ``buffer`` (from ``take``) as separate tensors; the buffer is idle again, to be taken
        anew, once every one of them is gone."""
        if count == 0:
            self._give_back(buffer)
            return []
        rows = list(buffer[:count, :width].unbind(0))
        with self._lock:
            self._lent[id(buffer)] = (buffer, count)
        for row in rows:
            weakref.finalize(row, self._row_gone, id(buffer))
        return rows

    @property
    def idle_bytes(self) -> int:
        with self._lock:
            return sum(b.numel() for b in self._idle)

    def _row_gone(self, key: int) -> None:
        with self._lock:
            buffer, left = self._lent[key]
            if left > 1:
                self._lent[key] = (buffer, left - 1)
                return
            del self._lent[key]
        self._give_back(buffer)

    def _give_back(self, buffer: torch.Tensor) -> None:
        with self._lock:
            self._idle.append(buffer)
            self._idle.sort(key=lambda b: b.shape[0], reverse=True)
            while sum(b.numel() for b in self._idle) > self.keep_bytes and self._idle:
                self._idle.pop()  # the smallest go first: a long prefix's buffer is kept
