"""The terminal table: one column per target, one row per figure."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.table import Table

from prefixcache.integrations.bench.metrics import speedups
from prefixcache.integrations.bench.runner import TargetRun


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _rate(value: Any) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _percent(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ratio(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}x"


ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("TTFT p50 (ms)", "median_ttft_ms", _ms),
    ("TTFT p90 (ms)", "p90_ttft_ms", _ms),
    ("TTFT p99 (ms)", "p99_ttft_ms", _ms),
    ("TTFT mean (ms)", "mean_ttft_ms", _ms),
    ("TPOT mean (ms)", "mean_tpot_ms", _ms),
    ("ITL p50 / mean (ms)", "itl", _ms),
    ("E2E p50 (ms)", "median_e2el_ms", _ms),
    ("E2E mean (ms)", "mean_e2el_ms", _ms),
    ("Requests/s", "request_throughput", _rate),
    ("Output tokens/s", "output_throughput", _rate),
    ("Total tokens/s", "total_token_throughput", _rate),
    ("Goodput (req/s)", "request_goodput", _rate),
    ("Prefix-cache hit rate", "prefix_cache_hit_rate", _percent),
    ("Peak KV usage", "peak_kv_usage", _percent),
    ("Client - engine TTFT mean (ms)", "mean_ttft_client_minus_engine_ms", _ms),
)


TIER_HIT_KEYS = ("host_tier_hit_tokens", "disk_tier_hit_tokens", "remote_tier_hit_tokens")


def tier_hits(engine_stats: dict[str, Any]) -> str | None:
    """The prompt tokens each KV tier under the pool served, as ``host / disk / shared`` (``-``
    for a tier the engine does not have); None when it has none (or is not embedded)."""
    if not any(key in engine_stats for key in TIER_HIT_KEYS):
        return None
    return " / ".join(
        f"{engine_stats[key]:,}" if key in engine_stats else "-" for key in TIER_HIT_KEYS
    )


def results_table(runs: Sequence[TargetRun], title: str) -> Table:
    """Figures per target; the first target is the baseline of the speedup rows."""
    table = Table(title=title, box=box.SIMPLE_HEAVY, title_justify="left")
    table.add_column("metric")
    for run in runs:
        table.add_column(run.label + (" (interrupted)" if run.interrupted else ""), justify="right")
    table.add_row(
        "Requests ok / failed", *(f"{r.summary['completed']} / {r.summary['failed']}" for r in runs)
    )
    table.add_row(
        "Prompt / output tokens",
        *(
            f"{r.summary['total_input_tokens']:,} / {r.summary['total_output_tokens']:,}"
            for r in runs
        ),
    )
    table.add_row("Duration (s)", *(f"{r.duration_s:.1f}" for r in runs))
    for label, key, fmt in ROWS:
        if key == "itl":
            table.add_row(
                label,
                *(
                    f"{_ms(r.summary['median_itl_ms'])} / {_ms(r.summary['mean_itl_ms'])}"
                    for r in runs
                ),
            )
        else:
            table.add_row(label, *(fmt(r.summary.get(key)) for r in runs))
    tiers = [tier_hits(r.engine_stats) for r in runs]
    if any(t is not None for t in tiers):
        table.add_row("Hit tokens from host / disk / shared tier", *(t or "-" for t in tiers))
    if len(runs) > 1:
        ratios = [speedups(runs[0].summary, r.summary) for r in runs]
        table.add_row(
            f"TTFT p50 speedup vs {runs[0].label}", *(_ratio(s["median_ttft"]) for s in ratios)
        )
        table.add_row(
            f"TTFT mean speedup vs {runs[0].label}", *(_ratio(s["mean_ttft"]) for s in ratios)
        )
    errors = [
        ", ".join(f"{k} x{v}" for k, v in r.summary["errors_by_kind"].items()) or "-" for r in runs
    ]
    if any(e != "-" for e in errors):
        table.add_row("Errors", *errors)
    return table
