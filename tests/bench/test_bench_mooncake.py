"""The mooncake workload: a Mooncake trace's prefix structure as real token ids, the same
requests the simulator replays, through `prefixcache bench`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_VOCAB
from test_bench_cli import invoke

from prefixcache.integrations.bench.token_source import TokenRange
from prefixcache.integrations.bench.workload_mooncake import MooncakeReplay
from prefixcache.integrations.bench.workload_registry import build_requests

TOKENS = TokenRange.for_vocab(32000)
TRACES = Path(__file__).resolve().parents[2] / "benchmarks" / "traces"
SHIPPED = TRACES / "mooncake_synthetic_trace.jsonl.gz"


def write_trace(path: Path) -> Path:
    lines = [
        {"timestamp": 1000, "input_length": 1100, "output_length": 7, "hash_ids": [4, 5, 6]},
        {"timestamp": 1500, "input_length": 1024, "output_length": 0, "hash_ids": [4, 5]},
        {"timestamp": 3000, "input_length": 300, "output_length": 900, "hash_ids": [9]},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_hash_ids_become_shared_prefixes_and_milliseconds_seconds(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    first, second, third = build_requests("mooncake", 0, TOKENS, {}, trace)
    assert (first.prompt_len, second.prompt_len, third.prompt_len) == (1100, 1024, 300)
    assert first.prompt_token_ids[:1024] == second.prompt_token_ids  # hash ids 4, 5
    assert first.prompt_token_ids[:512] != third.prompt_token_ids[:300]
    assert (first.timestamp, second.timestamp, third.timestamp) == (0.0, 0.5, 2.0)
    assert (first.max_tokens, second.max_tokens, third.max_tokens) == (7, 1, 900)
    again = build_requests("mooncake", 0, TOKENS, {}, trace)
    assert again == [first, second, third]  # one fixed seeded run per hash id
    assert build_requests("mooncake", 1, TOKENS, {}, trace)[0] != first


def test_limit_rate_scale_block_tokens_and_output_cap(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    options = {"limit": 2, "rate_scale": 4.0, "block_tokens": 16, "output_len": 5,
               "num_sessions": 3}  # other workloads' sizes are ignored  # fmt: skip
    first, second = build_requests("mooncake", 0, TOKENS, options, trace)
    assert (first.prompt_len, second.prompt_len) == (round(1100 * 16 / 512), 32)
    assert first.prompt_token_ids[:32] == second.prompt_token_ids
    assert (first.timestamp, second.timestamp) == (0.0, 0.125)
    assert (first.max_tokens, second.max_tokens) == (5, 1)


@pytest.mark.parametrize(("options", "message"), [
    ({"limit": 0}, "limit"), ({"rate_scale": 0}, "rate_scale"),
    ({"block_tokens": 513}, "block_tokens"), ({"output_len": -1}, "output_len"),
])  # fmt: skip
def test_bad_replay_options(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MooncakeReplay(**options)


def test_bad_trace_line_names_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": []}\n'
                   '{"timestamp": 1}\n')  # fmt: skip
    with pytest.raises(ValueError, match="line 2"):
        build_requests("mooncake", 0, TOKENS, {}, bad)
    with pytest.raises(ValueError, match="cannot be mixed"):
        build_requests("mooncake,agent", 0, TOKENS, {}, bad)
    with pytest.raises(ValueError, match="needs a trace FILE"):
        build_requests("mooncake", 0, TOKENS, {})


def test_shipped_trace_through_the_cli(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = invoke("--workload", "mooncake", str(SHIPPED), "--limit", "6", "--block-tokens", "4",
                    "--rate-scale", "100", "--output-len", "2", "--model", str(tiny_model_dir),
                    "--vocab-size", str(TINY_VOCAB), "--dtype", "float32", "--cache", "on",
                    "--no-plots", "--no-progress", "--output-dir", str(tmp_path))  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bench.json").read_text())
    target = report["targets"][0]
    assert len(target["input_lens"]) == 6 and max(target["output_lens"]) <= 2
    assert report["workload"] == "mooncake" and report["workload_overrides"]["limit"] == 6
