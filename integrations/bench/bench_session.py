"""One `prefixcache bench` run end to end: check the options, build the request list, run
every target, print the table, write JSON + CSV + PNGs (and the request list). Ctrl-C stops
sending and reports what finished.

Bad input raises ValueError before any file is written: output paths that cannot be written,
an embedded model whose configuration does not load, a vocabulary larger than the model's, a
bad URL or timeout, and a first target that does not start (its model or engine options).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
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
from prefixcache.integrations.bench.output_paths import check_output_dir, check_output_file
from prefixcache.integrations.bench.report_files import bench_record, write_csv, write_json
from prefixcache.integrations.bench.report_table import results_table
from prefixcache.integrations.bench.runner import Target, TargetRun, run_targets
from prefixcache.integrations.bench.target_embedded import EmbeddedTarget, model_vocab_size
from prefixcache.integrations.bench.target_url import UrlTarget
from prefixcache.integrations.bench.token_source import DEFAULT_VOCAB_SIZE, TokenRange
from prefixcache.integrations.bench.workload_registry import DEFAULT_WORKLOAD, build_requests

JSON_NAME, CSV_NAME = "bench.json", "bench_requests.csv"
DISTRIBUTION_PNG, SCATTER_PNG = "ttft_distribution.png", "ttft_vs_prompt_len.png"


@dataclass
class BenchOptions:
    """Everything the command line decides. ``cache_modes``: one embedded target per entry
    (True = prefix caching on), in column order; ``urls``: one remote target each.
    ``vocab_size``: synthetic token ids are drawn below it; None = ``DEFAULT_VOCAB_SIZE``,
    capped at the embedded model's vocabulary when there are embedded targets."""

    workload: str = DEFAULT_WORKLOAD
    trace_file: Path | None = None
    seed: int = 0
    vocab_size: int | None = None
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


def resolve_vocab_size(options: BenchOptions) -> int:
    """The vocabulary synthetic prompts draw from. With embedded targets it must fit the
    model's (read from its configuration, without loading weights): the default is capped at
    it and a larger explicit ``vocab_size`` is a ValueError; otherwise ``DEFAULT_VOCAB_SIZE``
    unless given."""
    if not options.cache_modes:
        return DEFAULT_VOCAB_SIZE if options.vocab_size is None else options.vocab_size
    model_vocab = model_vocab_size(options.model)
    if options.vocab_size is None:
        return min(DEFAULT_VOCAB_SIZE, model_vocab)
    if options.vocab_size > model_vocab:
        raise ValueError(
            f"vocab_size {options.vocab_size} is larger than the vocabulary of model "
            f"{options.model!r} ({model_vocab} tokens): prompts would hold out-of-vocabulary ids"
        )
    return options.vocab_size


def check_outputs(options: BenchOptions) -> None:
    """ValueError unless every file the run will write can be written."""
    if options.output_dir is not None:
        names = [JSON_NAME, CSV_NAME] + ([DISTRIBUTION_PNG, SCATTER_PNG] if options.plots else [])
        check_output_dir(options.output_dir, names)
    if options.save_requests is not None:
        check_output_file(options.save_requests, "request list file")


def make_requests(options: BenchOptions, vocab_size: int) -> list[BenchRequest]:
    """The request list, synthetic ids drawn below ``vocab_size`` (see
    ``resolve_vocab_size``); ValueError / TraceError for bad input."""
    tokens = TokenRange.for_vocab(vocab_size)
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
    """Blocking entry point; SIGINT (Ctrl-C) sets the stop event instead of raising. Bad
    input (see the module docstring) raises ValueError before any file is written."""
    console = console or Console()
    check_outputs(options)
    vocab_size = resolve_vocab_size(options)
    options = dataclasses.replace(options, vocab_size=vocab_size)  # the record shows the used one
    requests = make_requests(options, vocab_size)
    targets = make_targets(options)
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
        f"{options.load.describe(requests)}"
        + (" - INTERRUPTED, partial results" if interrupted else "")
    )
    console.print(results_table(runs, title))
    written = _write_outputs(options, requests, runs, record)
    for path in written:
        console.print(f"wrote {path}")
    return BenchOutcome(requests, runs, record, interrupted, written)


def _write_outputs(
    options: BenchOptions,
    requests: list[BenchRequest],
    runs: list[TargetRun],
    record: dict[str, Any],
) -> list[Path]:
    """The request list (if asked for), JSON, CSV and plots (if asked for); their paths."""
    written = []
    if options.save_requests is not None:
        written.append(write_request_list(requests, options.save_requests))
    if options.output_dir is None:
        return written
    folder = options.output_dir
    written += [write_json(record, folder / JSON_NAME), write_csv(runs, folder / CSV_NAME)]
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
        "load": options.load.describe(requests),
        "slo": None if options.slo is None else options.slo.as_dict(),
        "interrupted": interrupted,
    }
