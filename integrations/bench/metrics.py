"""Metric math over ``RequestResult``s: the fields ``vllm bench serve`` writes, plus prefix-cache
hit rate, peak KV usage and the client-vs-engine TTFT difference. Pure functions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefixcache.integrations.bench.request_result import RequestResult

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class Slo:
    """Goodput limits in milliseconds; a request is good when it meets every one given."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``"ttft:500,tpot:100"`` -> Slo; ValueError for an unknown key or a bad number."""
        limits: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition(":")
            if not sep or key.strip() not in ("ttft", "tpot", "e2el"):
                raise ValueError(f"bad SLO {part!r}: use ttft:MS, tpot:MS or e2el:MS")
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"bad SLO {part!r}: {value!r} is not a number") from None
            if not number > 0:
                raise ValueError(f"bad SLO {part!r}: the limit must be > 0 ms")
            limits[f"{key.strip()}_ms"] = number
        if not limits:
            raise ValueError("empty SLO: use e.g. ttft:500,tpot:100")
        return cls(**limits)

    def met_by(self, result: RequestResult) -> bool:
        pairs = (
            (self.ttft_ms, result.ttft),
            (self.tpot_ms, result.tpot),
            (self.e2el_ms, result.e2el),
        )
        return result.success and all(
            limit is None or (value or 0.0) * 1000.0 <= limit for limit, value in pairs
        )

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def latency_stats(name: str, seconds: Sequence[float]) -> dict[str, float | None]:
    """mean/median/std/p50/p90/p99 in ms, keyed ``mean_ttft_ms`` etc.; None when empty."""
    values = np.asarray(seconds, dtype=np.float64) * 1000.0
    empty = values.size == 0
    stats: dict[str, float | None] = {
        f"mean_{name}_ms": None if empty else float(values.mean()),
        f"median_{name}_ms": None if empty else float(np.median(values)),
        f"std_{name}_ms": None if empty else float(values.std()),
    }
    for q in PERCENTILES:
        stats[f"p{q}_{name}_ms"] = None if empty else float(np.percentile(values, q))
    return stats


def error_kind(message: str) -> str:
    """Group errors by their leading kind (``HTTP 503``, ``ConnectError``, ``timeout``...)."""
    head = message.split(":", 1)[0].strip()
    return head[:60] or "error"


def summarize(
    results: Sequence[RequestResult],
    duration_s: float,
    slo: Slo | None = None,
    peak_kv_usage: float | None = None,
) -> dict[str, Any]:
    """Aggregate figures of one target's run (throughputs over ``duration_s``)."""
    ok = [r for r in results if r.success]
    failed = [r for r in results if not r.success]
    input_tokens = sum(r.prompt_tokens for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    per_second = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    summary: dict[str, Any] = {
        "num_prompts": len(results),
        "completed": len(ok),
        "failed": len(failed),
        "duration": duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": per_second(len(ok)),
        "output_throughput": per_second(output_tokens),
        "total_token_throughput": per_second(input_tokens + output_tokens),
        "request_goodput": per_second(sum(slo.met_by(r) for r in ok)) if slo else None,
    }
    summary.update(latency_stats("ttft", [r.ttft for r in ok if r.ttft is not None]))
    summary.update(latency_stats("tpot", [r.tpot for r in ok if r.tpot is not None]))
    summary.update(latency_stats("itl", [gap for r in ok for gap in r.itls]))
    summary.update(latency_stats("e2el", [r.e2el for r in ok if r.e2el is not None]))
    reported = [r for r in ok if r.cached_tokens is not None]
    reported_prompt = sum(r.prompt_tokens for r in reported)
    summary["total_cached_tokens"] = sum(r.cached_tokens or 0 for r in reported)
    summary["prefix_cache_hit_rate"] = (
        summary["total_cached_tokens"] / reported_prompt if reported_prompt else None
    )
    summary["peak_kv_usage"] = peak_kv_usage
    summary.update(engine_ttft_agreement(ok))
    summary["errors_by_kind"] = dict(Counter(error_kind(r.error or "no tokens") for r in failed))
    return summary


def engine_ttft_agreement(results: Sequence[RequestResult]) -> dict[str, float | None]:
    """Client TTFT minus the engine's own TTFT (ms): mean and largest absolute difference."""
    diffs = [
        (r.ttft - r.engine_ttft) * 1000.0
        for r in results
        if r.ttft is not None and r.engine_ttft is not None
    ]
    return {
        "mean_ttft_client_minus_engine_ms": float(np.mean(diffs)) if diffs else None,
        "max_abs_ttft_client_minus_engine_ms": float(np.max(np.abs(diffs))) if diffs else None,
    }


def speedups(baseline: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    """baseline / other for TTFT (mean, p50, p90) and E2E mean; throughput other / baseline.
    > 1 means ``other`` is better. None when a figure is missing or zero."""

    def ratio(top: Any, bottom: Any) -> float | None:
        return top / bottom if top and bottom else None

    return {
        "mean_ttft": ratio(baseline["mean_ttft_ms"], other["mean_ttft_ms"]),
        "median_ttft": ratio(baseline["median_ttft_ms"], other["median_ttft_ms"]),
        "p90_ttft": ratio(baseline["p90_ttft_ms"], other["p90_ttft_ms"]),
        "mean_e2el": ratio(baseline["mean_e2el_ms"], other["mean_e2el_ms"]),
        "request_throughput": ratio(other["request_throughput"], baseline["request_throughput"]),
    }
