"""A KV tier shared by replicas in Redis or Valkey (``kv_remote="redis://host:port"``): what one
engine computed, another loads.

Each full block is two keys under ``pckv:<store key>:<namespace digest>:<block hash>``: ``:h``
(a JSON header: the namespace name, parent hash, tokens) and ``:p`` (the payload, laid out as
the disk tier's, then its xxh3-64). The store key is the disk tier's (model fingerprint, dtype,
block size, shape), so another model never reads the keys as its own; a block is confirmed by
namespace, parent and tokens, and its payload by the checksum, so a collision or a corrupt value
costs a miss. Writes go through a background thread (``SET NX``, pipelined), reads are two
pipelined ``MGET``s at admission. Every call has a timeout; a store that fails or is slow is
skipped for ``BACKOFF_S`` with one logged warning, and its blocks read as misses: the engine
never errors or hangs on it. Eviction is the store's (configure ``maxmemory`` and an LRU
``maxmemory-policy``).
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import xxhash

from prefixcache.engine.disk_kv_store import namespace_digest
from prefixcache.engine.kv_block_bytes import BlockBytes
from prefixcache.engine.latency_histogram import LatencyHistogram
from prefixcache.engine.tier_writer import BlockWriter
from prefixcache.host_tier import PersistBlock

log = logging.getLogger(__name__)

BACKOFF_S = 5.0
_CHECK = struct.Struct("<Q")


class RemoteKVTier:
    """The shared tier at ``url`` for blocks of ``record_bytes`` payload bytes."""

    def __init__(self, url: str, store: str, blocks: BlockBytes, timeout_s: float = 0.5,
                 max_queued_bytes: int = 256 << 20, max_known: int = 1 << 20) -> None:  # fmt: skip
        import redis

        try:
            self.client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                               socket_connect_timeout=timeout_s)  # fmt: skip
        except ValueError as error:
            raise ValueError(f"kv_remote={url!r} is not a redis:// URL: {error}") from error
        self.url, self.store, self.blocks = url, store, blocks
        self.errors = self.written = self.corrupt = self.hit_blocks = 0
        self._down_until = 0.0
        self.load_seconds = LatencyHistogram()  # each fetch
        # blocks this engine wrote or read (not written again), the newest max_known
        self._known: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._max_known = max_known
        self.writer = BlockWriter(blocks, self._write, "kv-remote-writer", max_queued_bytes)

    def _key(self, name: Any, block_hash: int) -> str:
        return f"pckv:{self.store}:{namespace_digest(name)}:{block_hash:016x}"

    # ------------------------------------------------------------------ the cache's LowerTier
    def holds(self, name: Any, block_hash: int) -> bool:
        return (namespace_digest(name), block_hash) in self._known

    def find(self, name: Any, parent_hash: int, hashes: list[int],
             tokens: list[tuple[int, ...]]) -> list[Any]:  # fmt: skip
        if not hashes or not self._up():
            return []
        headers = self._call(self.client.mget, [self._key(name, h) + ":h" for h in hashes])
        found, previous = [], parent_hash
        plain = json.loads(json.dumps(name, default=list))
        for block_hash, row, raw in zip(hashes, tokens, headers or [], strict=False):
            if raw is None:
                break
            try:
                header = json.loads(raw)
            except ValueError:
                break
            if header.get("name") != plain or header.get("parent") != previous or tuple(
                header.get("tokens", ())
            ) != row:
                break
            found.append(block_hash)
            previous = block_hash
        return found

    def fetch(self, name: Any, handles: Sequence[Any]) -> list[memoryview]:
        if not handles or not self._up():
            return []
        start = time.perf_counter()
        values = self._call(self.client.mget, [self._key(name, h) + ":p" for h in handles])
        payloads = []
        for block_hash, value in zip(handles, values or [], strict=False):
            size = self.blocks.record_bytes
            if value is None or len(value) != size + _CHECK.size:
                break
            payload, check = memoryview(value)[:size], _CHECK.unpack(value[size:])[0]
            if xxhash.xxh3_64_intdigest(payload) != check:
                self.corrupt += 1
                break
            payloads.append(payload)
            self._remember(namespace_digest(name), block_hash)
        self.hit_blocks += len(payloads)
        self.load_seconds.observe(time.perf_counter() - start, len(payloads))
        return payloads

    # ------------------------------------------------------------------ writes
    def persist(self, entries: Sequence[PersistBlock]) -> None:
        """Queue ``entries`` for the writer (``BlockWriter``); dropped while the store is down."""
        if self._up():
            self.writer.submit(entries)
        else:
            self.writer.drop(len(entries))

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def stats(self) -> dict[str, int]:
        return {
            "remote_tier_hit_tokens": self.hit_blocks * self.blocks.kv.block_size,
            "remote_tier_written": self.written, "remote_tier_errors": self.errors,
            "remote_tier_dropped_writes": self.writer.dropped_writes,
            "remote_tier_queued_bytes": self.writer.queued_bytes,
            "remote_tier_corrupt": self.corrupt,
        }  # fmt: skip

    def _write(self, entries: list[PersistBlock], payloads: list[memoryview]) -> None:
        if not self._up():
            return
        pipe = self.client.pipeline(transaction=False)
        for entry, payload in zip(entries, payloads, strict=True):
            key = self._key(entry.name, entry.block_hash)
            header = json.dumps({"name": entry.name, "parent": entry.parent_hash,
                                 "tokens": list(entry.tokens)}, default=list)  # fmt: skip
            check = _CHECK.pack(xxhash.xxh3_64_intdigest(payload))
            pipe.set(key + ":p", bytes(payload) + check, nx=True)
            pipe.set(key + ":h", header, nx=True)  # after its payload
        if self._call(pipe.execute) is not None:
            self.written += len(entries)
            for entry in entries:
                self._remember(namespace_digest(entry.name), entry.block_hash)

    def _remember(self, digest: str, block_hash: int) -> None:
        self._known[(digest, block_hash)] = None
        self._known.move_to_end((digest, block_hash))
        if len(self._known) > self._max_known:
            self._known.popitem(last=False)

    def _up(self) -> bool:
        return time.monotonic() >= self._down_until

    def _call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, or None when the store fails (then skipped for ``BACKOFF_S``)."""
        import redis

        try:
            return fn(*args)
        except (redis.RedisError, OSError) as error:
            self.errors += 1
            if self._up():
                log.warning("KV remote tier %s unavailable for %.0f s: %s", self.url,
                            BACKOFF_S, error)  # fmt: skip
            self._down_until = time.monotonic() + BACKOFF_S
            return None
