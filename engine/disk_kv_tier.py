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

import torch

from prefixcache.engine.disk_kv_store import DiskKVStore
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
        self.store = store
        self.max_queued_bytes = max_queued_bytes
        self.queued_bytes = 0
        self.dropped_writes = 0
        self.write_errors = 0
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
        return payloads

    # ------------------------------------------------------------------ bytes
    @torch.inference_mode()
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
        index = torch.tensor([entry.block for entry in kept], dtype=torch.int64)
        device = self.kv.k[0].device
        gathered = [pool.index_select(0, index.to(device)).cpu()  # [n, block_size, kv, dim]
                    for pools in (self.kv.k, self.kv.v) for pool in pools]  # fmt: skip
        with self._idle:
            self.queued_bytes += size * len(kept)
        self._queue.put((kept, gathered))

    def block_bytes(self, block: int) -> bytes:
        """Pool block ``block``'s bytes: every layer's K, then every layer's V."""
        parts = [pool[block].contiguous().view(torch.uint8).numpy().tobytes()
                 for pools in (self.kv.k, self.kv.v) for pool in pools]  # fmt: skip
        return b"".join(parts)

    @torch.inference_mode()
    def load(self, blocks: Sequence[int], payloads: Sequence[memoryview | bytes]) -> None:
        """Write each payload (a record's, laid out as ``block_bytes``) into its pool block:
        one copy of them all, then one scatter per layer's K and V."""
        rows = torch.stack([torch.frombuffer(_writable(p), dtype=torch.uint8) for p in payloads])
        index = torch.tensor(list(blocks), dtype=torch.int64)  # [n]
        offset = 0
        for pools in (self.kv.k, self.kv.v):
            for pool in pools:
                width = pool[0].numel() * pool.element_size()
                part = rows[:, offset : offset + width].view(pool.dtype)  # [n, block elements]
                device = pool.device
                pool.index_copy_(0, index.to(device), part.reshape(-1, *pool.shape[1:]).to(device))
                offset += width

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
        stats.update(disk_tier_dropped_writes=self.dropped_writes,
                     disk_tier_write_errors=self.write_errors,
                     disk_tier_queued_bytes=self.queued_bytes)  # fmt: skip
        return stats

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            entries, gathered = item
            # [n, layers * 2 * block bytes]: row i is block i's record payload
            rows = torch.cat([g.reshape(len(entries), -1).view(torch.uint8) for g in gathered],
                             dim=1).numpy()  # fmt: skip
            for i, entry in enumerate(entries):
                try:
                    self.store.write(entry.name, entry.block_hash, entry.parent_hash,
                                     entry.tokens, memoryview(rows[i]))  # fmt: skip
                except OSError as error:  # a full or failing disk: this block stays unwritten
                    self.write_errors += 1
                    log.warning("KV disk tier: a block was not written: %s", error)
                finally:
                    with self._idle:
                        self.queued_bytes -= self.store.record_bytes
                        self._idle.notify_all()


def _writable(payload: memoryview | bytes) -> memoryview | bytearray:
    """A buffer torch may wrap without a read-only warning (a record's payload view already
    is one: the store reads records into bytearrays)."""
    if isinstance(payload, memoryview) and not payload.readonly:
        return payload
    return bytearray(payload)
