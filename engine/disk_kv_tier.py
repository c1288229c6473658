"""The disk KV tier of an engine: every full block the prefix cache commits is persisted to a
``DiskKVStore`` by a background thread (write-through: a clean restart, or a crash, keeps what
was written), and blocks past a prompt's cached path are read back from it when the pool and
the host tier do not hold them.

Writes go through a ``BlockWriter`` (the bytes gathered when the cache hands the blocks out,
``PrefixCache.take_persist``; a bounded queue whose overflow is ``disk_tier_dropped_writes``).
Reads happen on the engine thread when a prompt is admitted (``fetch``, the payloads checked);
the runner copies the bytes into fresh pool blocks before the step (``BlockBytes.load``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from prefixcache.engine.disk_kv_store import DiskKVStore
from prefixcache.engine.kv_block_bytes import BlockBytes
from prefixcache.engine.kv_cache import PagedKVCache
from prefixcache.engine.tier_writer import BlockWriter
from prefixcache.host_tier import PersistBlock

log = logging.getLogger(__name__)


class DiskKVTier:
    """The disk tier over ``store`` for the pools of ``kv``; implements the cache's
    ``LowerTier`` (``find``, ``fetch``, ``holds``)."""

    def __init__(self, kv: PagedKVCache, store: DiskKVStore,
                 max_queued_bytes: int = 256 << 20) -> None:  # fmt: skip
        self.kv = kv
        self.bytes = BlockBytes(kv)
        self.store = store
        self.write_errors = 0
        self.hit_blocks = 0  # blocks read back into the pool
        self.writer = BlockWriter(self.bytes, self._write, "kv-disk-writer", max_queued_bytes)
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

    def fetch(self, name: Any, keys: Sequence[Any]) -> list[memoryview]:
        """The payloads of ``keys`` in order, up to the first that fails its checks."""
        payloads = []
        for key in keys:
            payload = self.store.read(key, name)
            if payload is None:
                break
            payloads.append(payload)
        self.hit_blocks += len(payloads)
        return payloads

    # ------------------------------------------------------------------ bytes
    def persist(self, blocks: Sequence[PersistBlock]) -> None:
        """Queue the committed ``blocks`` for writing (``BlockWriter``)."""
        self.writer.submit(blocks)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def stats(self) -> dict[str, int]:
        stats = self.store.stats()
        stats.update(disk_tier_hit_tokens=self.hit_blocks * self.kv.block_size,
                     disk_tier_dropped_writes=self.writer.dropped_writes,
                     disk_tier_write_errors=self.write_errors,
                     disk_tier_queued_bytes=self.writer.queued_bytes)  # fmt: skip
        return stats

    def _write(self, entries: list[PersistBlock], payloads: list[memoryview]) -> None:
        for entry, payload in zip(entries, payloads, strict=True):
            try:
                self.store.write(entry.name, entry.block_hash, entry.parent_hash,
                                 entry.tokens, payload)  # fmt: skip
            except OSError as error:  # a full or failing disk: this block stays unwritten
                self.write_errors += 1
                log.warning("KV disk tier: a block was not written: %s", error)
