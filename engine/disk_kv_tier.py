"""The disk KV tier of an engine: every full block the prefix cache commits is persisted to a
``DiskKVStore`` by a background thread (write-through: a clean restart, or a crash, keeps what
was written), and blocks past a prompt's cached path are read back from it when the pool and
the host tier do not hold them.

The engine thread copies a committed block's bytes out of the pool when the cache hands it out
(``PrefixCache.take_persist``, right after the step that filled it: its bytes are final), so
the writer never reads the pool; the queue is bounded (``max_queued_bytes``) and a block that
does not fit is not persisted (``disk_tier_dropped_writes``), never waited for. Reads happen on
the engine thread when a prompt is admitted (``fetch``, the payloads checked), and the bytes
are copied into fresh pool blocks before the step (``load``).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from typing import Any

from prefixcache.engine.disk_kv_store import DiskKVStore
from prefixcache.engine.kv_block_bytes import BlockBytes
from prefixcache.engine.kv_cache import PagedKVCache
from prefixcache.host_tier import PersistBlock

log = logging.getLogger(__name__)

_STOP = object()


class DiskKVTier:
    """The disk tier over ``store`` for the pools of ``kv``; implements the cache's
    ``LowerTier`` (``find``, ``fetch``, ``holds``)."""

    def __init__(self, kv: PagedKVCache, store: DiskKVStore,
                 max_queued_bytes: int = 256 << 20) -> None:  # fmt: skip
        self.kv = kv
        self.bytes = BlockBytes(kv)
        self.store = store
        self.max_queued_bytes = max_queued_bytes
        self.queued_bytes = 0
        self.dropped_writes = 0
        self.write_errors = 0
        self.hit_blocks = 0  # blocks read back into the pool
        self._queue: queue.Queue[Any] = queue.Queue()
        self._idle = threading.Condition()
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer",
                                        daemon=True)  # fmt: skip
        self._writer.start()
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
        """Queue the committed ``blocks`` for writing: their bytes are gathered out of the
        pool now (engine thread, before anything else writes the pool; one gather per layer
        for all of them), cut into records and written by the writer thread."""
        size = self.store.record_bytes
        room = max(0, (self.max_queued_bytes - self.queued_bytes) // size)
        kept = list(blocks[:room])
        self.dropped_writes += len(blocks) - len(kept)
        if not kept:
            return
        gathered = self.bytes.gather([entry.block for entry in kept])
        with self._idle:
            self.queued_bytes += size * len(kept)
        self._queue.put((kept, gathered))

    def load(self, blocks: Sequence[int], payloads: Sequence[memoryview | bytes]) -> None:
        """Write each payload (a record's) into its pool block."""
        self.bytes.load(blocks, payloads)

    def flush(self) -> None:
        """Wait until every queued block is written."""
        with self._idle:
            self._idle.wait_for(lambda: self.queued_bytes == 0)

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        self.flush()
        self._queue.put(_STOP)
        self._writer.join()

    def stats(self) -> dict[str, int]:
        stats = self.store.stats()
        stats.update(disk_tier_hit_tokens=self.hit_blocks * self.kv.block_size,
                     disk_tier_dropped_writes=self.dropped_writes,
                     disk_tier_write_errors=self.write_errors,
                     disk_tier_queued_bytes=self.queued_bytes)  # fmt: skip
        return stats

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            entries, gathered = item
            for entry, payload in zip(entries, self.bytes.payloads(gathered), strict=True):
                try:
                    self.store.write(entry.name, entry.block_hash, entry.parent_hash,
                                     entry.tokens, payload)  # fmt: skip
                except OSError as error:  # a full or failing disk: this block stays unwritten
                    self.write_errors += 1
                    log.warning("KV disk tier: a block was not written: %s", error)
                finally:
                    with self._idle:
                        self.queued_bytes -= self.store.record_bytes
                        self._idle.notify_all()

