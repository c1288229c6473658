"""One `prefixcache bench` run end to end: build the request list, run every target, print
the table, write JSON + CSV + PNGs. Ctrl-C stops sending and reports what finished."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prefixcache.integrations.bench.bench_request import BenchRequest, write_request_list
from prefixcache.integrations.bench.load_generator import LoadConfig
from prefixcache.integrations.bench.metrics import Slo
from prefixcache.integrations.bench.report_files import bench_record, write_csv, write_json
from prefixcache.integrations.bench.report_table import results_table
from prefixcache.integrations.bench.runner import Target, TargetRun, run_targets
from prefixcache.integrations.bench.target_embedded import EmbeddedTarget
from prefixcache.integrations.bench.target_url import UrlTarget
from prefixcache.integrations.bench.token_source import DEFAULT_VOCAB_SIZE, TokenRange
from prefixcache.integrations.bench.workload_registry import DEFAULT_WORKLOAD, build_requests

JSON_NAME, CSV_NAME = "bench.json", "bench_requests.csv"
DISTRIBUTION_PNG, SCATTER_PNG = "ttft_distribution.png", "ttft_vs_prompt_len.png"


@dataclass
class BenchOptions:
    """Everything the command line decides. ``cache_modes``: one embedded target per entry
    (True = prefix caching on), in column order; ``urls``: one remote target each."""

    workload: str = DEFAULT_WORKLOAD
    trace_file: Path | None = None
    seed: int = 0
    vocab_size: int = DEFAULT_VOCAB_SIZE
    sizes: dict[str, Any] = field(default_factory=dict)
    model: str = "smollm2"
    cache_modes: tuple[bool, ...] = (False, True)
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    urls: tuple[str, ...] = ()
    url_model: str | None = None
    timeout_s: float = 300.0
    api_key: str | None = None
    load: LoadConfig = field(default_factory=LoadConfig)
    slo: Slo | None = None
    output_dir: Path | None = Path("results/bench")
    save_requests: Path | None = None
    plots: bool = True
    progress: bool = True
    warmup: bool = True


@dataclass
class BenchOutcome:
    requests: list[BenchRequest]
    runs: list[TargetRun]
    record: dict[str, Any]
    interrupted: bool
    written: list[Path]


def make_requests(options: BenchOptions) -> list[BenchRequest]:
    """The request list (ValueError / TraceError for bad input)."""
    tokens = TokenRange.for_vocab(options.vocab_size)
    return build_requests(options.workload, options.seed, tokens, options.sizes, options.trace_file)


def make_targets(options: BenchOptions) -> list[Target]:
    targets: list[Target] = [
        EmbeddedTarget(options.model, cache_on, **options.llm_kwargs)
        for cache_on in options.cache_modes
    ]
    labels = [f"url {u}" if len(options.urls) > 1 else "url" for u in options.urls]
    targets += [
        UrlTarget(
            url, label, options.url_model, timeout_s=options.timeout_s, api_key=options.api_key
        )
        for url, label in zip(options.urls, labels, strict=True)
    ]
    if not targets:
        raise ValueError("no target: use --target embedded and/or --url URL")
    return targets


def run_bench(options: BenchOptions, console: Console | None = None) -> BenchOutcome:
    """Blocking entry point; SIGINT (Ctrl-C) sets the stop event instead of raising."""
    console = console or Console()
    requests = make_requests(options)
    targets = make_targets(options)
    if options.save_requests is not None:
        write_request_list(requests, options.save_requests)
    return asyncio.run(_run(options, requests, targets, console))


async def _run(
    options: BenchOptions, requests: list[BenchRequest], targets: list[Target], console: Console
) -> BenchOutcome:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not options.progress,
    )
    try:
        with progress:
            runs = await run_targets(
                targets, requests, options.load, stop, options.slo, progress, options.warmup
            )
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signal.SIGINT)
    interrupted = stop.is_set()
    record = bench_record(runs, _config_record(options, requests, interrupted))
    title = (
        f"prefixcache bench: {options.workload}, {len(requests)} requests, "
        f"{options.load.describe()}" + (" - INTERRUPTED, partial results" if interrupted else "")
    )
    console.print(results_table(runs, title))
    written = _write_outputs(options, runs, record)
    for path in written:
        console.print(f"wrote {path}")
    return BenchOutcome(requests, runs, record, interrupted, written)


def _write_outputs(
    options: BenchOptions, runs: list[TargetRun], record: dict[str, Any]
) -> list[Path]:
    if options.output_dir is None:
        return []
    folder = options.output_dir
    written = [write_json(record, folder / JSON_NAME), write_csv(runs, folder / CSV_NAME)]
    if options.plots and runs:
        from prefixcache.integrations.bench.report_plots import (
            plot_ttft_distribution,
            plot_ttft_vs_prompt_len,
        )

        written.append(plot_ttft_distribution(runs, folder / DISTRIBUTION_PNG))
        written.append(plot_ttft_vs_prompt_len(runs, folder / SCATTER_PNG))
    return written


def _config_record(
    options: BenchOptions, requests: list[BenchRequest], interrupted: bool
) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S"),
        "workload": options.workload,
        "trace_file": None if options.trace_file is None else str(options.trace_file),
        "seed": options.seed,
        "vocab_size": options.vocab_size,
        "workload_overrides": {k: v for k, v in options.sizes.items() if v is not None},
        "num_prompts": len(requests),
        "request_rate": options.load.request_rate or "inf",
        "burstiness": options.load.burstiness,
        "max_concurrency": options.load.concurrency,
        "load": options.load.describe(),
        "slo": None if options.slo is None else options.slo.as_dict(),
        "interrupted": interrupted,
    }
