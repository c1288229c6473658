"""The url target against a live OpenAI-compatible server (a stand-in backed by the engine on
the tiny model, over real HTTP), plus unreachable, failing and hanging servers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TINY_VOCAB
from openai_standin import completions_app, failing_app, serving
from rich.console import Console

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.engine.llm import LLM
from prefixcache.integrations.bench.bench_session import BenchOptions, run_bench

SHARED = {
    "num_groups": 2,
    "prompts_per_group": 2,
    "system_len": 48,
    "question_len": 8,
    "output_len": 4,
}


@pytest.fixture(scope="module")
def standin(tiny_model_dir: Path) -> Iterator[tuple[str, AsyncLLM]]:
    engine = AsyncLLM(LLM(str(tiny_model_dir), dtype="float32", num_blocks=64))
    try:
        with serving(completions_app(engine, "tiny-standin")) as url:
            yield url, engine
    finally:
        stats = engine.stats()
        engine.llm.cache.check_invariants()
        engine.shutdown()
        assert stats["in_use"] == 0 and stats["running"] == 0


def url_options(urls: tuple[str, ...], **overrides) -> BenchOptions:
    values = {
        "workload": "shared-prefix",
        "sizes": SHARED,
        "vocab_size": TINY_VOCAB,
        "cache_modes": (),
        "urls": urls,
        "output_dir": None,
        "progress": False,
    }
    values.update(overrides)
    return BenchOptions(**values)


def quiet() -> Console:
    return Console(width=160, record=True)


@pytest.mark.parametrize("load", [{}, {"concurrency": 3}])
def test_live_server_streams_exact_tokens_with_usage(standin, load: dict) -> None:
    from prefixcache.integrations.bench.load_generator import LoadConfig

    url, engine = standin
    asyncio.run(engine.reset_cache())  # a cold cache for this run
    outcome = run_bench(url_options((url,), load=LoadConfig(**load)), quiet())
    (run,) = outcome.runs
    assert run.model == "tiny-standin"  # discovered from /v1/models
    assert run.summary["completed"] == 4 and run.summary["failed"] == 0
    assert all(r.output_tokens == 4 and r.prompt_tokens == 56 for r in run.results)
    assert all(len(r.token_times) == 4 for r in run.results)
    assert all(r.cached_tokens is not None for r in run.results)
    if not load:  # sequential: every second prompt of a group reuses its 3 system blocks
        groups_seen: set[str] = set()
        for request, result in zip(outcome.requests, run.results, strict=True):
            assert result.cached_tokens == (48 if request.group in groups_seen else 0)
            groups_seen.add(request.group)
        assert run.engine_stats["metrics_hit_rate"] == pytest.approx(96 / 224)
    assert run.summary["peak_kv_usage"] is not None


def test_hit_rate_falls_back_to_server_metrics(standin) -> None:
    _, engine = standin
    asyncio.run(engine.reset_cache())
    with serving(completions_app(engine, "tiny-standin", report_cached=False)) as url:
        outcome = run_bench(url_options((url,)), quiet())
    summary = outcome.runs[0].summary
    assert all(r.cached_tokens is None for r in outcome.runs[0].results)
    assert summary["prefix_cache_hit_rate_source"] == "metrics"
    assert summary["prefix_cache_hit_rate"] == pytest.approx(96 / 224)


def test_two_targets_side_by_side_with_an_unreachable_one(standin, tmp_path: Path) -> None:
    url, _ = standin
    console = quiet()
    outcome = run_bench(url_options((url, "http://127.0.0.1:9"), output_dir=tmp_path), console)
    live, dead = outcome.runs
    assert live.summary["completed"] == 4
    assert dead.summary["completed"] == 0 and dead.summary["failed"] == 4
    assert dead.setup_error is not None and "ConnectError" in dead.setup_error
    assert dead.summary["errors_by_kind"] == {"ConnectError": 4}
    text = console.export_text()
    assert "ConnectError x4" in text and "0 / 4" in text


def test_server_errors_are_counted() -> None:
    with serving(failing_app("error")) as url:
        outcome = run_bench(url_options((url,)), quiet())
    summary = outcome.runs[0].summary
    assert summary["failed"] == 4 and summary["errors_by_kind"] == {"HTTP 503": 4}
    assert outcome.runs[0].results[0].error == "HTTP 503: the server is overloaded"


def test_timeouts_are_counted() -> None:
    with serving(failing_app("hang")) as url:
        outcome = run_bench(
            url_options((url,), timeout_s=0.3, sizes={**SHARED, "prompts_per_group": 1}), quiet()
        )
    summary = outcome.runs[0].summary
    assert summary["failed"] == 2 and summary["errors_by_kind"] == {"timeout after 0.3 s": 2}
