"""Read KV usage and prefix-cache counters from a server's Prometheus ``/metrics`` text.

Servers name these differently; the first known name present wins. Missing -> None.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

KV_USAGE_NAMES = (
    "prefixcache_kv_cache_usage_ratio",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
)
PREFIX_HIT_NAMES = ("prefixcache_prefix_cache_hits_tokens", "vllm:prefix_cache_hits")
PREFIX_QUERY_NAMES = ("prefixcache_prefix_cache_queries_tokens", "vllm:prefix_cache_queries")


@dataclass(frozen=True)
class ServerGauges:
    """A fraction in [0, 1] and two monotonic token counters, each None when not exported."""

    kv_usage: float | None
    prefix_hit_tokens: float | None
    prefix_query_tokens: float | None


def parse_metrics(text: str) -> ServerGauges:
    """Sum each metric over its label sets (one per engine/model). Unparseable text -> Nones."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name.removesuffix("_total")
                totals[name] = totals.get(name, 0.0) + float(sample.value)
    except (ValueError, TypeError):
        return ServerGauges(None, None, None)
    return ServerGauges(
        _first(totals, KV_USAGE_NAMES),
        _first(totals, PREFIX_HIT_NAMES),
        _first(totals, PREFIX_QUERY_NAMES),
    )


def _first(totals: dict[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in totals:
            return totals[name]
    return None
