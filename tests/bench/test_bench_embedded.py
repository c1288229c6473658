"""Short real runs against the embedded engine on a tiny random model: exact token counts,
cache hits where the workload shares prefixes, engine-vs-client TTFT, Ctrl-C, no leaks."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TINY_VOCAB
from rich.console import Console

from prefixcache.integrations.bench.bench_session import BenchOptions, run_bench
from prefixcache.integrations.bench.load_generator import LoadConfig
from prefixcache.integrations.bench.metrics import Slo
from prefixcache.integrations.bench.runner import TargetSetupError
from prefixcache.integrations.bench.target_embedded import EmbeddedTarget

SHARED = {
    "num_groups": 2,
    "prompts_per_group": 3,
    "system_len": 64,
    "question_len": 16,
    "output_len": 3,
}


def options(model_dir: Path, tmp_path: Path, **overrides) -> BenchOptions:
    values = {
        "workload": "shared-prefix",
        "sizes": SHARED,
        "vocab_size": TINY_VOCAB,
        "model": str(model_dir),
        "llm_kwargs": {"dtype": "float32", "num_blocks": 64},
        "output_dir": tmp_path / "out",
        "progress": False,
    }
    values.update(overrides)
    return BenchOptions(**values)


def quiet() -> Console:
    return Console(width=140, record=True, force_terminal=False)


def test_cache_off_vs_on_exact_counts_and_hits(tiny_model_dir: Path, tmp_path: Path) -> None:
    console = quiet()
    outcome = run_bench(options(tiny_model_dir, tmp_path), console)
    off, on = outcome.runs
    assert (off.label, on.label) == ("cache off", "cache on")
    seen_groups: set[str] = set()
    expected_cached = {}
    for request in outcome.requests:  # the first prompt of a group is cold, then 4 blocks hit
        expected_cached[request.request_id] = 64 if request.group in seen_groups else 0
        seen_groups.add(request.group)
    for run in (off, on):
        assert run.summary["completed"] == 6 and run.summary["failed"] == 0
        assert [r.request_id for r in run.results] == [r.request_id for r in outcome.requests]
        assert all(r.output_tokens == 3 and len(r.token_times) == 3 for r in run.results)
        assert all(r.prompt_tokens == 80 for r in run.results)
        # the client starts its clock before the engine's arrival and sees the token after it
        assert all(r.ttft >= r.engine_ttft > 0 for r in run.results)
        assert run.summary["mean_ttft_client_minus_engine_ms"] >= 0
        assert run.engine_stats["in_use"] == 0 and run.engine_stats["running"] == 0
        assert 0 < run.summary["peak_kv_usage"] <= 1
    assert all(r.cached_tokens == 0 for r in off.results)
    assert {r.request_id: r.cached_tokens for r in on.results} == expected_cached
    assert on.summary["prefix_cache_hit_rate"] == pytest.approx(4 * 64 / (6 * 80))
    names = sorted(path.name for path in outcome.written)
    assert names == [
        "bench.json",
        "bench_requests.csv",
        "ttft_distribution.png",
        "ttft_vs_prompt_len.png",
    ]
    record = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert [t["label"] for t in record["targets"]] == ["cache off", "cache on"]
    assert not record["interrupted"]
    text = console.export_text()
    assert "cache off" in text and "TTFT p50 (ms)" in text


def test_poisson_arrivals_with_batching(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Open-loop arrivals overlap in the engine; every request still completes exactly."""
    load = LoadConfig(request_rate=200.0, burstiness=0.5, concurrency=4, seed=1)
    outcome = run_bench(
        options(
            tiny_model_dir,
            tmp_path,
            cache_modes=(True,),
            load=load,
            output_dir=None,
            slo=Slo(ttft_ms=60_000),
        ),
        quiet(),
    )
    run = outcome.runs[0]
    assert run.summary["completed"] == 6 and run.summary["request_goodput"] > 0
    assert all(r.output_tokens == 3 for r in run.results)
    assert run.engine_stats["in_use"] == 0


def test_same_seed_same_requests_and_hits(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A seed fixes the request list, so a rerun sees the same cache hits."""
    first = run_bench(
        options(tiny_model_dir, tmp_path, cache_modes=(True,), output_dir=None), quiet()
    )
    second = run_bench(
        options(tiny_model_dir, tmp_path, cache_modes=(True,), output_dir=None), quiet()
    )
    assert first.requests == second.requests
    assert [r.cached_tokens for r in first.runs[0].results] == [
        r.cached_tokens for r in second.runs[0].results
    ]


def test_ctrl_c_reports_what_finished(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = EmbeddedTarget.send
    calls = []

    async def send_then_interrupt(self, request, result) -> None:
        await original(self, request, result)
        calls.append(request.request_id)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends

    monkeypatch.setattr(EmbeddedTarget, "send", send_then_interrupt)
    console = quiet()
    outcome = run_bench(options(tiny_model_dir, tmp_path), console)
    assert outcome.interrupted
    assert len(outcome.runs) == 1  # the cache-on target never started
    run = outcome.runs[0]
    # The signal reaches the event loop a moment after the second request finished: the
    # request in flight then may still finish first; the rest are never sent.
    assert run.interrupted and 2 <= len(run.results) < len(outcome.requests)
    assert run.summary["completed"] == len(run.results)
    assert run.engine_stats["in_use"] == 0  # the aborted request freed its blocks
    assert "INTERRUPTED" in console.export_text()
    assert json.loads((tmp_path / "out" / "bench.json").read_text())["interrupted"]


def test_a_model_that_does_not_load_raises_before_anything_is_written(tmp_path: Path) -> None:
    saved = tmp_path / "requests.jsonl"
    with pytest.raises(ValueError, match="does not exist"):
        run_bench(
            options(tmp_path / "no-such-model", tmp_path, save_requests=saved), quiet()
        )
    assert not saved.exists() and not (tmp_path / "out").exists()


def test_a_bad_engine_option_raises_from_the_first_target(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The configuration reads fine; the engine refuses the option when the target starts."""
    with pytest.raises(TargetSetupError, match="num_blocks"):
        run_bench(
            options(tiny_model_dir, tmp_path, llm_kwargs={"dtype": "float32", "num_blocks": 0}),
            quiet(),
        )
    assert not (tmp_path / "out").exists()


def test_a_later_target_that_does_not_start_is_reported(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = EmbeddedTarget.start

    async def start_or_fail(self, warmup: bool = True) -> None:
        if self.cache_on:
            raise TargetSetupError("out of memory, say")
        await original(self, warmup)

    monkeypatch.setattr(EmbeddedTarget, "start", start_or_fail)
    outcome = run_bench(options(tiny_model_dir, tmp_path, output_dir=None), quiet())
    off, on = outcome.runs
    assert off.summary["completed"] == 6
    assert on.setup_error == "TargetSetupError: out of memory, say"
    assert on.summary["failed"] == 6 and on.summary["completed"] == 0


def test_the_default_vocabulary_fits_the_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    outcome = run_bench(
        options(tiny_model_dir, tmp_path, cache_modes=(True,), output_dir=None, vocab_size=None),
        quiet(),
    )
    assert outcome.record["vocab_size"] == TINY_VOCAB
    assert outcome.runs[0].summary["completed"] == 6
    assert max(t for r in outcome.requests for t in r.prompt_token_ids) < TINY_VOCAB


def test_a_vocabulary_larger_than_the_model_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=f"larger than the vocabulary .* \\({TINY_VOCAB} tokens"):
        run_bench(options(tiny_model_dir, tmp_path, vocab_size=4000), quiet())


def test_out_of_vocabulary_prompts_fail_per_request(tiny_model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_token_ids": [5, 4000], "max_tokens": 2}\n' * 2)
    outcome = run_bench(
        options(
            tiny_model_dir, tmp_path, workload="trace", trace_file=trace, cache_modes=(True,),
            output_dir=None,
        ),
        quiet(),
    )
    summary = outcome.runs[0].summary
    assert summary["failed"] == 2 and list(summary["errors_by_kind"]) == ["ValueError"]
    assert outcome.runs[0].engine_stats["in_use"] == 0



def test_the_warmup_prompt_stays_inside_a_small_vocabulary() -> None:
    target = EmbeddedTarget("unused", cache_on=True)
    target.engine = SimpleNamespace(
        llm=SimpleNamespace(cache=SimpleNamespace(block_size=16), config=SimpleNamespace(
            vocab_size=110))
    )
    prompt = target._warmup_prompt()
    assert len(prompt) == 32 and max(prompt) < 110
    assert prompt[:3] == [100, 101, 102]
