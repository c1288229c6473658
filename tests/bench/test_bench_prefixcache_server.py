"""The url target against our own server (`prefixcache serve`'s app) on the tiny model."""

from __future__ import annotations

from pathlib import Path

from conftest import TINY_VOCAB
from rich.console import Console

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.engine.llm import LLM
from prefixcache.integrations.bench.bench_session import BenchOptions, run_bench
from prefixcache.integrations.bench.load_generator import LoadConfig
from prefixcache.integrations.bench.prometheus_scrape import parse_metrics
from prefixcache.integrations.server import BackgroundServer, build_app


def test_bench_against_prefixcache_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = AsyncLLM(LLM(str(tiny_model_dir), dtype="float32", num_blocks=64))
    sizes = {
        "num_sessions": 2,
        "turns_per_session": 3,
        "system_len": 32,
        "user_len": 8,
        "call_len": 8,
        "result_len": 16,
        "output_len": 3,
    }
    try:
        with BackgroundServer(build_app(engine, model_name="tiny")) as server:
            outcome = run_bench(
                BenchOptions(
                    workload="agent",
                    sizes=sizes,
                    vocab_size=TINY_VOCAB,
                    cache_modes=(),
                    urls=(server.base_url + "/v1",),
                    load=LoadConfig(concurrency=2),
                    output_dir=tmp_path,
                    progress=False,
                ),
                Console(width=140, record=True),
            )
    finally:
        stats = engine.stats()
        engine.llm.cache.check_invariants()
        engine.shutdown()
    (run,) = outcome.runs
    assert run.model == "tiny" and run.summary["completed"] == 6
    assert all(r.output_tokens == 3 for r in run.results)  # from usage
    # text streaming: a token that decodes to no text yet rides in a later chunk
    assert all(1 <= len(r.token_times) <= 3 for r in run.results)
    lengths = {r.request_id: r.prompt_tokens for r in run.results}
    assert lengths["agent-s1-t2"] == 40 + 2 * 24
    assert all(r.cached_tokens is not None for r in run.results)
    assert run.summary["total_cached_tokens"] > 0  # turns reuse their session's history
    assert run.engine_stats["metrics_hit_rate"] is not None  # read from /metrics
    assert stats["in_use"] == 0 and stats["running"] == 0


def test_api_key_is_sent_and_a_wrong_one_is_counted(tiny_model_dir: Path) -> None:
    engine = AsyncLLM(LLM(str(tiny_model_dir), dtype="float32", num_blocks=64))
    sizes = {
        "num_prefixes": 1,
        "num_prompts": 2,
        "prefix_len": 16,
        "suffix_len": 4,
        "output_len": 2,
    }
    try:
        with BackgroundServer(build_app(engine, model_name="tiny", api_key="sesame")) as server:
            runs = [
                run_bench(
                    BenchOptions(
                        workload="prefix-repetition",
                        sizes=sizes,
                        vocab_size=TINY_VOCAB,
                        cache_modes=(),
                        urls=(server.base_url,),
                        api_key=key,
                        output_dir=None,
                        progress=False,
                    ),
                    Console(width=140, record=True),
                ).runs[0]
                for key in ("sesame", "wrong")
            ]
    finally:
        stats = engine.stats()
        engine.shutdown()
    assert runs[0].summary["completed"] == 2
    assert runs[1].summary["errors_by_kind"] == {"HTTP 401": 2}
    assert runs[1].setup_error is not None  # /v1/models was refused too
    assert stats["in_use"] == 0


def test_parse_metrics_of_known_servers() -> None:
    ours = parse_metrics(
        "# TYPE prefixcache_kv_cache_usage_ratio gauge\nprefixcache_kv_cache_usage_ratio 0.25\n"
        "# TYPE prefixcache_prefix_cache_hits_tokens counter\n"
        "prefixcache_prefix_cache_hits_tokens_total 30.0\n"
        "# TYPE prefixcache_prefix_cache_queries_tokens counter\n"
        "prefixcache_prefix_cache_queries_tokens_total 120.0\n"
    )
    assert (ours.kv_usage, ours.prefix_hit_tokens, ours.prefix_query_tokens) == (0.25, 30, 120)
    vllm = parse_metrics(
        '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{engine="0"} 0.5\n'
    )
    assert vllm.kv_usage == 0.5 and vllm.prefix_hit_tokens is None
    assert parse_metrics("not prometheus {{{").kv_usage is None
