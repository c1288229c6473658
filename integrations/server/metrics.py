"""Prometheus metrics: cache and scheduler counters read from the engine, latency histograms.

Each app owns its own ``CollectorRegistry`` (several servers in one process do not clash).
Engine counters are read once per scrape from a stats snapshot taken on the engine thread
(``refresh``), so a scrape never races a step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from prefixcache.engine.outputs import RequestOutput

PREFIX = "prefixcache"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# stats key -> (metric name suffix, help, kind)
ENGINE_SERIES: tuple[tuple[str, str, str, str], ...] = (
    ("query_tokens", "prefix_cache_queries_tokens_total", "Prompt tokens looked up", "counter"),
    ("hit_tokens", "prefix_cache_hits_tokens_total", "Prompt tokens found cached", "counter"),
    ("evictions", "prefix_cache_evictions_total", "Cached blocks evicted", "counter"),
    ("preemptions", "preemptions_total", "Requests preempted for lack of blocks", "counter"),
    ("usage", "kv_cache_usage_ratio", "Fraction of KV blocks in use by requests", "gauge"),
    ("hit_rate", "prefix_cache_hit_rate", "hit_tokens / query_tokens since start", "gauge"),
    ("num_blocks", "kv_cache_blocks", "KV blocks in the pool", "gauge"),
    ("free", "kv_cache_free_blocks", "KV blocks free", "gauge"),
    ("cached", "kv_cache_cached_blocks", "KV blocks cached and evictable or pinned", "gauge"),
    ("running", "num_requests_running", "Requests being decoded", "gauge"),
    ("request_errors", "engine_request_errors_total",
     "Requests failed by an engine step that raised (the engine went on serving)", "counter"),
    ("failed_steps", "engine_failed_steps_total",
     "Engine steps whose model forward raised", "counter"),
    ("waiting", "num_requests_waiting", "Requests waiting for admission", "gauge"),
    ("host_tier_hit_tokens", "host_tier_hits_tokens_total",
     "Prompt tokens loaded from the host-memory KV tier instead of computed", "counter"),
    ("host_tier_blocks", "host_tier_blocks", "KV blocks the host-memory tier holds", "gauge"),
    ("host_tier_slots", "host_tier_capacity_blocks", "KV blocks the host-memory tier can hold",
     "gauge"),
    ("host_tier_writebacks", "host_tier_writebacks_total",
     "Evicted KV blocks copied into the host-memory tier", "counter"),
    ("host_tier_loads", "host_tier_loads_total",
     "KV blocks copied from the host-memory tier back into the pool", "counter"),
    ("host_tier_evictions", "host_tier_evictions_total",
     "KV blocks the host-memory tier dropped to make room", "counter"),
    ("disk_tier_hit_tokens", "disk_tier_hits_tokens_total",
     "Prompt tokens read from the disk KV tier instead of computed", "counter"),
    ("disk_tier_records", "disk_tier_blocks", "KV blocks the disk tier holds", "gauge"),
    ("disk_tier_bytes", "disk_tier_bytes", "Bytes of the disk tier's records", "gauge"),
    ("disk_tier_written", "disk_tier_writes_total", "KV blocks written to the disk tier",
     "counter"),
    ("disk_tier_dropped_records", "disk_tier_dropped_records_total",
     "Disk records found torn or corrupt (at start or when read), dropped", "counter"),
    ("disk_tier_dropped_writes", "disk_tier_dropped_writes_total",
     "KV blocks not written to disk because the write queue was full", "counter"),
    ("disk_tier_queued_bytes", "disk_tier_write_queue_bytes",
     "Bytes waiting to be written to the disk tier", "gauge"),
    ("remote_tier_hit_tokens", "remote_tier_hits_tokens_total",
     "Prompt tokens loaded from the shared KV store instead of computed", "counter"),
    ("remote_tier_written", "remote_tier_writes_total",
     "KV blocks written to the shared store", "counter"),
    ("remote_tier_errors", "remote_tier_errors_total",
     "Shared-store calls that failed or timed out (their blocks read as misses)", "counter"),
    ("remote_tier_dropped_writes", "remote_tier_dropped_writes_total",
     "KV blocks not written to the shared store (write queue full, or the store down)",
     "counter"),
    ("remote_tier_queued_bytes", "remote_tier_write_queue_bytes",
     "Bytes waiting to be written to the shared store", "gauge"),
    ("remote_tier_corrupt", "remote_tier_corrupt_total",
     "Shared-store values that failed their checksum (read as misses)", "counter"),
    ("sliding_slots", "sliding_kv_slots", "Blocks the sliding-window layers' slot pool holds "
     "(hybrid KV cache)", "gauge"),
    ("sliding_slots_held", "sliding_kv_slots_held",
     "Sliding slots held by running requests' windows", "gauge"),
    ("sliding_slots_taken", "sliding_kv_slots_taken_total",
     "Sliding slots taken from a block whose keys they held", "counter"),
    ("sliding_shortened_tokens", "sliding_kv_shortened_hit_tokens_total",
     "Prompt tokens recomputed because a cached prefix's last window lost its slots",
     "counter"),
)


class _EngineStatsCollector(Collector):
    """Exposes the last stats snapshot as Prometheus families."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] = {}

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        yield from _tier_latency_families(self.snapshot.get("tier_latency_seconds"))
        for key, suffix, help_text, kind in ENGINE_SERIES:
            if key not in self.snapshot:
                continue
            name = f"{PREFIX}_{suffix}"
            value = float(self.snapshot[key])
            if kind == "counter":
                yield CounterMetricFamily(name.removesuffix("_total"), help_text, value=value)
            else:
                yield GaugeMetricFamily(name, help_text, value=value)


def _tier_latency_families(latency: dict[str, Any] | None) -> Iterator[HistogramMetricFamily]:
    """``prefixcache_kv_tier_{load,store}_seconds`` histograms labelled by tier, from the
    engine's ``tier_latency_seconds`` snapshot (``KVTiers.latency``)."""
    if not latency:
        return
    for op, help_text in (("load", "Time to copy or read a batch of KV blocks from a tier"),
                          ("store", "Time to copy or write a batch of KV blocks to a tier")):
        family = HistogramMetricFamily(f"{PREFIX}_kv_tier_{op}_seconds", help_text,
                                       labels=["tier"])  # fmt: skip
        for tier, ops in latency.items():
            hist = ops[op]
            buckets = [(str(bound) if bound == "+Inf" else repr(float(bound)), count)
                       for bound, count in hist["buckets"]]  # fmt: skip
            family.add_metric([tier], buckets, hist["sum"])
        yield family


class ServerMetrics:
    """Latency histograms (observed when a request finishes) plus engine counters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._engine = _EngineStatsCollector()
        self.registry.register(self._engine)
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds", "Arrival to first token",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.inter_token = Histogram(
            f"{PREFIX}_inter_token_latency_seconds", "Mean gap between output tokens",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.e2e = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds", "Arrival to finish",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.finished = Counter(
            f"{PREFIX}_request_success",
            "Completions ended, by finish reason (abort: the client left; error: the engine "
            "failed it)",
            ["finish_reason"], registry=self.registry,
        )
        self.rejected = Counter(
            f"{PREFIX}_request_rejected", "Requests refused by the admission queue",
            registry=self.registry,
        )

    def observe(self, output: RequestOutput) -> None:
        """Record a finished request's latencies."""
        metrics = output.metrics
        if metrics.ttft is not None:
            self.ttft.observe(metrics.ttft)
        if metrics.tpot is not None:
            self.inter_token.observe(metrics.tpot)
        if metrics.e2e is not None:
            self.e2e.observe(metrics.e2e)
        for completion in output.outputs:
            self.finished.labels(finish_reason=completion.finish_reason or "unknown").inc()

    def unfinished(self, reason: str, completions: int) -> None:
        """Record a request that ended without finishing (``abort``, ``error``): its
        ``completions`` (its ``n``) under that finish reason."""
        self.finished.labels(finish_reason=reason).inc(completions)

    def render(self, stats: dict[str, Any]) -> bytes:
        """The text exposition format, with engine counters from ``stats``."""
        self._engine.snapshot = dict(stats)
        return generate_latest(self.registry)
