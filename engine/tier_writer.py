"""The background writer of a persistent KV tier: committed blocks' bytes are gathered out of
the pool on the engine thread when they are handed over (their bytes are final then, and the
pool may be written again right after), queued within ``max_queued_bytes`` (what does not fit is
dropped and counted, never waited for), and written by one thread through the tier's ``write``
(a batch of entries and their payloads; it handles its own store's errors). ``flush`` waits for
the queue; ``close`` flushes and stops the thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from queue import Queue
from typing import Any

from prefixcache.engine.kv_block_bytes import BlockBytes
from prefixcache.host_tier import PersistBlock

WriteBatch = Callable[[list[PersistBlock], list[memoryview]], None]
_STOP = object()


class BlockWriter:
    """Writes ``submit``-ted blocks of ``blocks``' layout through ``write`` on thread ``name``."""

    def __init__(self, blocks: BlockBytes, write: WriteBatch, name: str,
                 max_queued_bytes: int = 256 << 20) -> None:  # fmt: skip
        self.blocks = blocks
        self.max_queued_bytes = max_queued_bytes
        self.queued_bytes = 0
        self.dropped_writes = 0
        self._write = write
        self._queue: Queue[Any] = Queue()
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, entries: Sequence[PersistBlock]) -> None:
        """Queue ``entries`` (engine thread: their bytes are gathered now)."""
        size = self.blocks.record_bytes
        room = max(0, (self.max_queued_bytes - self.queued_bytes) // size)
        kept = list(entries[:room])
        self.dropped_writes += len(entries) - len(kept)
        if not kept:
            return
        gathered = self.blocks.gather([entry.block for entry in kept])
        with self._idle:
            self.queued_bytes += size * len(kept)
        self._queue.put((kept, gathered))

    def drop(self, count: int) -> None:
        """Count ``count`` blocks the tier would not take (its store is down)."""
        self.dropped_writes += count

    def flush(self) -> None:
        """Wait until every queued block is written."""
        with self._idle:
            self._idle.wait_for(lambda: self.queued_bytes == 0)

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        self.flush()
        self._queue.put(_STOP)
        self._thread.join()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            entries, gathered = item
            try:
                self._write(entries, self.blocks.payloads(gathered))
            finally:
                with self._idle:
                    self.queued_bytes -= self.blocks.record_bytes * len(entries)
                    self._idle.notify_all()
