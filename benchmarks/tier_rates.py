"""The rates a KV tier's loads are held against in ``tiered_cache.py``: what the tier read
(from its load-latency histogram), the same bytes read raw from the disk or the store, and a
plain memory copy of as many bytes."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from prefixcache.engine.disk_record import aligned_array, direct_io_works


def histogram_rate(before: dict[str, Any], after: dict[str, Any], block_bytes: int) -> float:
    """GB/s of the loads a tier's ``load`` histogram saw between two snapshots."""
    seconds = after["sum"] - before["sum"]
    blocks = after["blocks"] - before["blocks"]
    return blocks * block_bytes / seconds / 1e9 if seconds > 0 else 0.0


def raw_disk_read(paths: list[Path], threads: int = 8) -> dict[str, Any]:
    """GB/s of reading ``paths`` whole, ``threads`` at a time, with O_DIRECT where the file
    system takes it (so from the device, not the page cache), without any check."""
    direct = bool(paths) and direct_io_works(paths[0].parent)
    sizes = [path.stat().st_size for path in paths]
    buffers = [aligned_array(1, -(-size // 4096) * 4096)[0] for size in sizes]

    def read(i: int) -> int:
        fd = os.open(paths[i], os.O_RDONLY | (os.O_DIRECT if direct else 0))
        try:
            return os.preadv(fd, [buffers[i]], 0)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        total = sum(pool.map(read, range(len(paths))))
        seconds = time.perf_counter() - start
    return {"gbps": total / seconds / 1e9, "bytes": total, "direct_io": direct,
            "threads": threads}  # fmt: skip


def raw_store_read(client: Any, keys: list[str]) -> float:
    """GB/s of one MGET of ``keys`` from a redis client, values unchecked."""
    start = time.perf_counter()
    values = client.mget(keys)
    seconds = time.perf_counter() - start
    return sum(len(v) for v in values if v is not None) / seconds / 1e9


def memory_copy(nbytes: int) -> float:
    """GB/s of torch copying ``nbytes`` between two buffers already touched (best of 5)."""
    source = torch.ones(nbytes, dtype=torch.uint8)
    target = torch.zeros_like(source)
    fastest = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        target.copy_(source)
        fastest = min(fastest, time.perf_counter() - start)
    return nbytes / fastest / 1e9
