"""The background writer of a persistent KV tier: committed blocks' bytes are gathered out of
the pool on the engine thread when they are handed over (their bytes are final then, and the
pool may be written again right after), queued within ``max_queued_bytes`` (what does not fit is
dropped and counted, never waited for), and written by one thread through the tier's ``write``
(a batch of entries and their payloads; it handles its own store's errors). ``flush`` waits for
the queue; ``close`` flushes and stops the thread, and runs at the interpreter's exit if nobody
called it (queued blocks are written, and no torch call of the thread runs into the
interpreter's teardown, which aborted the process)."""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Sequence
from queue import Queue
from typing import Any

import numpy as np

from prefixcache.engine.kv_block_bytes import BlockBytes
from prefixcache.engine.latency_histogram import LatencyHistogram
from prefixcache.host_tier import PersistBlock

WriteBatch = Callable[[list[PersistBlock], list[memoryview]], None]
_STOP = object()


class BlockWriter:
    """Writes ``submit``-ted blocks of ``blocks``' layout through ``write`` on thread ``name``."""

    def __init__(self, blocks: BlockBytes, write: WriteBatch, name: str,
                 max_queued_bytes: int = 256 << 20,
                 rows: Callable[[int], np.ndarray] | None = None) -> None:  # fmt: skip
        """``rows(n)``, when given, lends the writer thread a [>= n, >= record_bytes] buffer
        to lay a batch's payloads out in (reused from batch to batch)."""
        self.blocks = blocks
        self._rows = rows
        self.max_queued_bytes = max_queued_bytes
        self.queued_bytes = 0
        self.dropped_writes = 0
        self.store_seconds = LatencyHistogram()  # each batch written
        self._write = write
        self._queue: Queue[Any] = Queue()
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        atexit.register(self.close)

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
        """Write what is queued, then stop the thread (once; later calls return at once)."""
        if not self._thread.is_alive():
            return
        atexit.unregister(self.close)
        self.flush()
        self._queue.put(_STOP)
        self._thread.join()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            entries, gathered = item
            start = time.perf_counter()
            try:
                out = None if self._rows is None else self._rows(len(entries))
                self._write(entries, self.blocks.payloads(gathered, out))
            finally:
                self.store_seconds.observe(time.perf_counter() - start, len(entries))
                with self._idle:
                    self.queued_bytes -= self.blocks.record_bytes * len(entries)
                    self._idle.notify_all()
