"""The disk KV tier of an engine: every full block the prefix cache commits is persisted to a
``DiskKVStore`` by a background thread (write-through: a clean restart, or a crash, keeps what
was written), and blocks past a prompt's cached path are read back from it when the pool and
the host tier do not hold them.

Writes go through a ``BlockWriter`` (the bytes gathered when the cache hands the blocks out,
``PrefixCache.take_persist``; a bounded queue whose overflow is ``disk_tier_dropped_writes``).
Reads (``fetch``, on the engine's ``TierFetcher`` thread while the request waits) go straight
into the rows of a reused staging buffer (``StagingRows``), ``READERS`` records at a time (a
disk serves parallel reads faster: 1.5 GB/s with 8 against 0.85 with 1, cold, on this
project's test machines), each checked; the runner then copies the rows into fresh pool blocks
before the step (``BlockBytes.load``, one copy per layer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from prefixcache.engine.disk_kv_store import DiskKVStore
from prefixcache.engine.disk_record import aligned_array
from prefixcache.engine.kv_block_bytes import BlockBytes
from prefixcache.engine.kv_cache import PagedKVCache
from prefixcache.engine.kv_tier_codec import TierCodec
from prefixcache.engine.latency_histogram import LatencyHistogram
from prefixcache.engine.staging_rows import StagingRows
from prefixcache.engine.tier_writer import BlockWriter
from prefixcache.host_tier import PersistBlock

log = logging.getLogger(__name__)

READERS = 8  # records read at once


class DiskKVTier:
    """The disk tier over ``store`` for the pools of ``kv``; implements the cache's
    ``LowerTier`` (``find``, ``fetch``, ``holds``)."""

    def __init__(self, kv: PagedKVCache, store: DiskKVStore, codec: TierCodec | None = None,
                 max_queued_bytes: int = 256 << 20) -> None:  # fmt: skip
        self.kv = kv
        self.bytes = BlockBytes(kv, codec)
        self.store = store
        self.write_errors = 0
        self.hit_blocks = 0  # blocks read back into the pool
        self.load_seconds = LatencyHistogram()  # each fetch
        self.writer = BlockWriter(self.bytes, self._write, "kv-disk-writer", max_queued_bytes,
                                  self._write_rows)  # fmt: skip
        self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="kv-disk-reader")
        self.staging = StagingRows(store.padded_bytes, allocate=aligned_array)
        self._out: np.ndarray | None = None  # the writer thread's rows, [n, padded] aligned
        if store.dropped:
            log.warning("KV disk tier %s: %d torn or corrupt records dropped at start",
                        store.folder, store.dropped)  # fmt: skip
        log.info("KV disk tier %s: %d records (%d bytes)", store.folder, len(store.records),
                 store.bytes)  # fmt: skip

    # ------------------------------------------------------------------ the cache's LowerTier
    def holds(self, name: Any, block_hash: int) -> bool:
        return self.store.key_of(name, block_hash) in self.store

    def find(self, name: Any, parent_hash: int, hashes: list[int],
             tokens: list[tuple[int, ...]]) -> list[Any]:  # fmt: skip
        return self.store.find(name, parent_hash, hashes, tokens)

    def fetch(self, name: Any, keys: Sequence[Any]) -> list[torch.Tensor]:
        """The payloads of ``keys`` in order, up to the first that fails its checks: rows of
        one staging tensor ([record_bytes] uint8 each)."""
        start = time.perf_counter()
        buffer = self.staging.take(len(keys))  # [>= n, padded_bytes] uint8, page-aligned
        array = buffer.numpy()  # the reads fill its rows

        def read(i: int) -> bool:
            return self.store.read(keys[i], name, array[i]) is not None

        found = 0
        for ok in self._readers.map(read, range(len(keys))):
            if not ok:
                break
            found += 1
        self.hit_blocks += found
        self.load_seconds.observe(time.perf_counter() - start, found)
        return self.staging.lend(buffer, found, self.bytes.record_bytes)

    # ------------------------------------------------------------------ bytes
    def persist(self, blocks: Sequence[PersistBlock]) -> None:
        """Queue the committed ``blocks`` for writing (``BlockWriter``)."""
        self.writer.submit(blocks)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
        self._readers.shutdown(wait=True)

    def stats(self) -> dict[str, int]:
        stats = self.store.stats()
        stats.update(disk_tier_hit_tokens=self.hit_blocks * self.kv.block_size,
                     disk_tier_dropped_writes=self.writer.dropped_writes,
                     disk_tier_write_errors=self.write_errors,
                     disk_tier_queued_bytes=self.writer.queued_bytes)  # fmt: skip
        return stats

    def _write_rows(self, count: int) -> np.ndarray:  # [>= count, padded_bytes] uint8
        """The writer thread's page-aligned rows, zero past each payload (never written)."""
        if self._out is None or self._out.shape[0] < count:
            self._out = aligned_array(max(count, 64), self.store.padded_bytes)
        return self._out

    def _write(self, entries: list[PersistBlock], payloads: list[memoryview]) -> None:
        for entry, payload in zip(entries, payloads, strict=True):
            try:
                self.store.write(entry.name, entry.block_hash, entry.parent_hash,
                                 entry.tokens, payload)  # fmt: skip
            except OSError as error:  # a full or failing disk: this block stays unwritten
                self.write_errors += 1
                log.warning("KV disk tier: a block was not written: %s", error)
