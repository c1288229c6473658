"""Runs one request list against each target in turn and collects per-target results."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.progress import Progress

from prefixcache.integrations.bench.bench_request import BenchRequest
from prefixcache.integrations.bench.load_generator import LoadConfig, run_load
from prefixcache.integrations.bench.metrics import Slo, summarize
from prefixcache.integrations.bench.request_result import RequestResult


class TargetSetupError(ValueError):
    """A target could not start because of what it was given (a model that does not load, a
    bad engine option). The message names the cause, including the original exception type."""


class Target(Protocol):
    """What the runner needs of a target (see EmbeddedTarget, UrlTarget)."""

    kind: str
    label: str
    setup_error: str | None
    peak_kv_usage: float | None
    final_stats: dict[str, Any]

    @property
    def model_name(self) -> str: ...

    async def start(self, warmup: bool = True) -> None: ...

    async def send(self, request: BenchRequest, result: RequestResult) -> None: ...

    async def close(self) -> None: ...


@dataclass
class TargetRun:
    """One target's outcome. ``interrupted``: stopped early, ``results`` holds what finished."""

    label: str
    kind: str
    model: str
    results: list[RequestResult]
    duration_s: float
    summary: dict[str, Any]
    setup_error: str | None = None
    interrupted: bool = False
    engine_stats: dict[str, Any] = field(default_factory=dict)


def new_result(request: BenchRequest) -> RequestResult:
    return RequestResult(
        request.request_id,
        request.workload,
        request.group,
        request.prompt_len,
        request.max_tokens,
    )


async def run_target(
    target: Target,
    requests: Sequence[BenchRequest],
    load: LoadConfig,
    stop: asyncio.Event,
    slo: Slo | None = None,
    progress: Progress | None = None,
    warmup: bool = True,
    raise_setup_error: bool = False,
) -> TargetRun:
    """Start the target, replay ``requests`` per ``load``, close it. Setup failures (a model
    that does not load) become a failed result per request, not an exception, except a
    ``TargetSetupError`` when ``raise_setup_error``: that propagates (after ``close``)."""
    task_id = progress.add_task(target.label, total=len(requests)) if progress else None

    def on_result(result: RequestResult) -> None:
        if progress is not None and task_id is not None:
            progress.advance(task_id)

    async def send(request: BenchRequest) -> RequestResult:
        result = new_result(request)
        await target.send(request, result)
        return result

    results: list[RequestResult] = []
    began = ended = time.perf_counter()
    try:
        try:
            await target.start(warmup=warmup)
        except (OSError, ValueError, RuntimeError) as error:
            if raise_setup_error and isinstance(error, TargetSetupError):
                raise
            target.setup_error = f"{type(error).__name__}: {error}"
            results = [_failed(request, target.setup_error) for request in requests]
        else:
            began = time.perf_counter()
            if not stop.is_set():
                results = await run_load(requests, send, load, stop, on_result)
            ended = time.perf_counter()
    finally:
        await target.close()
    if progress is not None and task_id is not None:
        progress.update(task_id, visible=False)
    summary = summarize(results, ended - began, slo, target.peak_kv_usage)
    summary["prefix_cache_hit_rate_source"] = "usage"
    if summary["prefix_cache_hit_rate"] is None:  # no usage.cached_tokens: try /metrics
        summary["prefix_cache_hit_rate"] = target.final_stats.get("metrics_hit_rate")
        summary["prefix_cache_hit_rate_source"] = (
            None if summary["prefix_cache_hit_rate"] is None else "metrics"
        )
    return TargetRun(
        label=target.label,
        kind=target.kind,
        model=target.model_name,
        results=results,
        duration_s=ended - began,
        summary=summary,
        setup_error=target.setup_error,
        interrupted=stop.is_set() and len(results) < len(requests),
        engine_stats=dict(target.final_stats),
    )


async def run_targets(
    targets: Sequence[Target],
    requests: Sequence[BenchRequest],
    load: LoadConfig,
    stop: asyncio.Event,
    slo: Slo | None = None,
    progress: Progress | None = None,
    warmup: bool = True,
) -> list[TargetRun]:
    """Targets one after another (never side by side: they would share the CPU).

    A ``TargetSetupError`` of the first target propagates: nothing has been measured yet, and
    a model or option that does not load is bad input, not a result. A later target's setup
    failure (the same model already loaded once, so more likely memory) is recorded in its run.
    """
    runs = []
    for index, target in enumerate(targets):
        if stop.is_set():
            break
        runs.append(
            await run_target(
                target, requests, load, stop, slo, progress, warmup, raise_setup_error=index == 0
            )
        )
    return runs


def _failed(request: BenchRequest, error: str) -> RequestResult:
    result = new_result(request)
    result.error = error
    return result
