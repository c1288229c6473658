"""The KV tiers under an engine's pool, built from its options: the host-memory tier (L2), the
disk tier (L3) and the shared store (L4), the lower two chained as the cache's ``LowerTier``
and read ahead of admission by a ``TierFetcher``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefixcache import PrefixCache
from prefixcache.engine.disk_kv_store import DiskKVStore, store_key
from prefixcache.engine.disk_kv_tier import DiskKVTier
from prefixcache.engine.host_kv_tier import HostKVTier
from prefixcache.engine.kv_block_bytes import BlockBytes
from prefixcache.engine.kv_cache import PagedKVCache
from prefixcache.engine.kv_tier_codec import TierCodec
from prefixcache.engine.lower_tiers import LowerTiers
from prefixcache.engine.model_config import ModelConfig
from prefixcache.engine.remote_kv_tier import RemoteKVTier
from prefixcache.engine.tier_fetcher import TierFetcher

DEFAULT_KV_DISK_SIZE = 10 << 30


class KVTiers:
    """The tiers of one engine (each None when not asked for). ``host_slots`` blocks of host
    memory; ``disk_dir`` / ``disk_size`` for the disk tier; ``remote`` a redis:// URL; every
    tier stores blocks through ``codec`` when one is given (``kv_tier_dtype``)."""

    def __init__(self, config: ModelConfig, kv: PagedKVCache, cache: PrefixCache,
                 fingerprint: str, host_slots: int = 0, disk_dir: str | Path | None = None,
                 disk_size: int | None = None, remote: str | None = None,
                 codec: TierCodec | None = None) -> None:  # fmt: skip
        self.codec = codec
        self.host = HostKVTier(kv, host_slots, codec) if host_slots else None
        self.disk: DiskKVTier | None = None
        self.remote: RemoteKVTier | None = None
        stored = str(kv.dtype) if codec is None else codec.tag
        key = store_key(fingerprint, stored, kv.block_size, config.num_layers,
                        config.num_kv_heads, config.head_dim)  # fmt: skip
        if disk_dir is not None:
            size = DEFAULT_KV_DISK_SIZE if disk_size is None else disk_size
            store = DiskKVStore(Path(disk_dir), key, BlockBytes(kv, codec).record_bytes, size)
            self.disk = DiskKVTier(kv, store, codec)
        if remote is not None:
            if not isinstance(remote, str):
                raise TypeError(f"kv_remote must be a redis:// URL, got {type(remote).__name__}")
            self.remote = RemoteKVTier(remote, key, BlockBytes(kv, codec))
        persistent = [t for t in (self.disk, self.remote) if t is not None]
        self.lower = LowerTiers(persistent) if persistent else None
        # how the lower tiers' payloads are written into the pool
        self.block_bytes = BlockBytes(kv, codec) if persistent else None
        self.fetcher = TierFetcher(self.lower.fetch) if self.lower is not None else None
        cache.set_lower_tier(self.lower)

    def flush(self) -> None:
        """Wait until every block handed to the lower tiers is written."""
        if self.lower is not None:
            self.lower.flush()

    def close(self) -> None:
        """Write what is queued, then stop the tiers' threads."""
        for tier in (self.disk, self.remote):
            if tier is not None:
                tier.close()
        if self.fetcher is not None:
            self.fetcher.close()

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        if self.lower is not None:
            stats.update(self.lower.stats())
        if self.host is not None:
            stats.update(host_tier_bytes=self.host.nbytes,
                         host_tier_writebacks=self.host.writebacks,
                         host_tier_loads=self.host.loads)  # fmt: skip
        latency = self.latency()
        if latency:
            stats["tier_latency_seconds"] = latency
        return stats

    def latency(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Load and store latency histograms by tier ("host", "disk", "remote") and operation
        ("load": a batch copied or read back; "store": a batch copied or written out)."""
        found: dict[str, dict[str, dict[str, Any]]] = {}
        if self.host is not None:
            found["host"] = {"load": self.host.load_seconds.snapshot(),
                             "store": self.host.store_seconds.snapshot()}  # fmt: skip
        for name, tier in (("disk", self.disk), ("remote", self.remote)):
            if tier is not None:
                found[name] = {"load": tier.load_seconds.snapshot(),
                               "store": tier.writer.store_seconds.snapshot()}  # fmt: skip
        return found
