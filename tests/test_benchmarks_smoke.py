"""The benchmark scripts run end to end in --quick mode and write the JSON they promise.

Only structure and deterministic outcomes are checked, never timings.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prefixcache.kernels.cpu import (
    cpu_linear_supports,
    f32_attention_available,
    f32_linear_supports,
)

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def run_quick(script: str, out: Path, *extra: str) -> dict:
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(out.read_text())


def test_fragmentation_quick(tmp_path):
    result = run_quick("fragmentation.py", tmp_path / "nested" / "fragmentation.json")
    assert set(result) == {"config", "trace", "contiguous", "paged", "ratios", "run"}
    assert result["config"]["quick"] is True
    metrics = {"utilization", "occupancy", "max_concurrent", "mean_concurrent", "steps"}
    for policy in ("contiguous", "paged"):
        assert metrics <= set(result[policy])
        assert 0 < result[policy]["utilization"] <= 1
    # Same memory, deterministic trace: paged blocks hold more requests and waste less.
    cap = result["config"]["num_slots"] // result["config"]["max_model_len"]
    assert result["contiguous"]["max_concurrent"] == cap
    assert result["paged"]["max_concurrent"] > cap
    assert result["paged"]["utilization"] > result["contiguous"]["utilization"]
    assert result["contiguous"]["preemptions"] == 0


def test_prefixcache_bench_quick(tmp_path):
    result = run_quick("prefixcache_bench.py", tmp_path / "bench.json")
    assert set(result) == {"config", "match", "scale", "evicting_allocate", "ratios", "targets",
                           "run"}
    expected_targets = {
        "match_numpy_ms",
        "speedup_vs_vllm_sha256",
        "insert_empty_ms",
        "bytes_per_cached_block",
        "match_big_over_small",
        "allocate1_us_per_block",
        "allocate16_us_per_block",
    }
    assert set(result["targets"]) == expected_targets
    for entry in result["targets"].values():
        assert math.isfinite(entry["value"]) and entry["value"] > 0
        assert isinstance(entry["ok"], bool)
    for key in ("vllm_sha256_pickle_ms", "vllm_xxh3_128_pickle_ms", "xxh3_64_chain_ms"):
        assert result["match"][key] > 0
    assert result["match"]["num_tokens"] == 32_768
    assert result["scale"]["cached_blocks"] >= result["config"]["scale_blocks"]


def test_cpu_linear_quick(tmp_path):
    if not cpu_linear_supports(torch.zeros(2, 2, dtype=torch.bfloat16)):
        pytest.skip("the compiled CPU kernels are unavailable on this machine")
    result = run_quick("cpu_linear.py", tmp_path / "cpu_linear.json")
    assert result["quick"] is True
    assert [row["rows"] for row in result["streamed"]] == [1, 64]
    assert {(row["out"], row["in"]) for row in result["hot"]} == {
        (960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)
    }
    for row in result["streamed"] + result["hot"]:
        assert row["ratio"] > 0 and math.isfinite(row["ratio"])


def test_warm_breakdown_quick(tmp_path):
    if not cpu_linear_supports(torch.zeros(2, 2, dtype=torch.bfloat16)):
        pytest.skip("the compiled CPU kernels are unavailable on this machine")
    result = run_quick("warm_breakdown.py", tmp_path / "warm.json")
    assert (result["prefix_tokens"], result["suffix_tokens"], result["requests"]) == (256, 16, 3)
    assert 0 < result["computed_tokens_mean"] <= 16
    phases = result["phase_ms"]
    for phase in ("qkv", "attention", "o_proj", "gate_up_silu", "down", "output_head"):
        assert phases[phase] > 0, phase
    layers = sum(ms for phase, ms in phases.items() if phase not in (
        "output_head", "outside_compiled_layers"))
    assert layers < result["request_ms_mean"]
    assert set(result["phase_gflops"]) == {"qkv", "attention", "o_proj", "gate_up_silu", "down"}


def test_greedy_head_quick(tmp_path):
    from prefixcache.kernels.cpu import greedy_screen_available

    if not greedy_screen_available():
        pytest.skip("the greedy screen needs the compiled kernels and AVX512-VNNI")
    result = run_quick("greedy_head.py", tmp_path / "greedy_head.json")
    assert result["quick"] is True and set(result["head"]) >= {"1", "2", "3", "4"}
    left = result["head"]["strips_left_one_row"]
    assert 1 <= left["median"] <= left["max"] <= result["head"]["strips"]
    for side in ("screen", "full"):
        assert result["engine"][side]["tpot_s"] > 0 and result["engine"][side]["warm_ttft_s"] > 0


def test_stream_text_quick(tmp_path):
    result = run_quick("stream_text.py", tmp_path / "stream_text.json")
    assert result["quick"] is True
    assert set(result["results"]) == {"english_64", "mixed_64", "english_256", "mixed_256"}
    for row in result["results"].values():
        assert row["new_tokens_us"] > 0 and row["whole_us"] > 0
        assert math.isclose(row["new_over_whole"], row["new_tokens_us"] / row["whole_us"])


@pytest.mark.skipif(not f32_attention_available(), reason="no float32 CPU attention kernel here")
def test_cpu_attention_f32_quick(tmp_path):
    result = run_quick("cpu_attention_f32.py", tmp_path / "f32.json", "--against", "HEAD")
    assert result["meta"]["dtype"] == "float32" and result["meta"]["against"] == "HEAD"
    assert [case["case"] for case in result["cases"]] == [
        "cold prefill, 1,637 tokens",
        "64 new over 1,637 cached",
        "64 new over 1,637 cached, 30 layers' pools",
        "64 new over 4,096 cached, 30 layers' pools",
        "decode, 32 sequences x 300-400",
        "decode, 32 x 300-400, 30 layers' pools",
        "decode, 1 sequence x 1,701",
    ]
    peak = result["meta"]["fma_peak_gflops"]
    for case in result["cases"]:
        assert case["kernel_s"] > 0 and case["reference_s"] > 0 and case["kernel_gflops"] > 0
        assert math.isclose(case["kernel_of_peak"], case["kernel_gflops"] / peak)
        assert case["against_s"] > 0  # the kernel as HEAD has it, timed in the same rounds
        assert math.isclose(case["vs_against"], case["kernel_s"] / case["against_s"])


@pytest.mark.skipif(
    not f32_linear_supports(torch.zeros(2, 2)), reason="no float32 CPU GEMM here"
)
def test_cpu_linear_f32_quick(tmp_path):
    result = run_quick("cpu_linear_f32.py", tmp_path / "linear_f32.json", "--against", "HEAD")
    assert result["meta"]["layers"] == 2
    assert [row["rows"] for row in result["rows"]] == [1, 32, 64, 1637]
    assert all(row["compiled_s"] > 0 and row["onednn_s"] > 0 for row in result["rows"])
    peak = result["meta"]["fma_peak_gflops"]
    for row in result["rows"]:
        assert math.isclose(row["compiled_of_peak"], row["compiled_gflops"] / peak)
        assert math.isclose(row["vs_against"], row["compiled_s"] / row["against_s"])


def test_soak_short_run(tmp_path):
    """A short soak against a real `prefixcache serve`: every answer expected, no block left
    in use, the cache's invariants checked (RSS growth is the full run's verdict, not this)."""
    out = tmp_path / "soak.json"
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "soak.py"), "--requests", "60", "--warmup", "30",
         "--sample-every", "20", "--concurrency", "8", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert out.exists(), completed.stderr
    result = json.loads(out.read_text())
    assert sum(result["outcomes"].values()) == 60
    assert result["unexpected"] == []
    assert result["end"]["status"] == 200 and not result["end"]["blocks_leaked"]
    assert {"rss_warmup", "rss_final", "growth_max_pct"} <= set(result["growth"])


def test_loop_stall_quick(tmp_path):
    result = run_quick("loop_stall.py", tmp_path / "loop_stall.json")
    statuses = {(row["server"], row["request"]): (row["status"], row["code"])
                for row in result["rows"]}
    assert statuses[("default", "256 text prompts at the token cap")] == (200, None)
    assert statuses[("default", "ids filling the body cap")] == (400, "too_many_prompt_tokens")
    assert statuses[("default", "temperature 5e-324")] == (200, None)
    assert statuses[("wide", "ids filling the body cap")][0] == 400
    assert all(row["health_samples"] > 0 for row in result["rows"])


def test_structured_output_quick(tmp_path):
    result = run_quick("structured_output.py", tmp_path / "structured.json")
    assert set(result["per_token"]) == {"1", "2"}
    for row in result["per_token"].values():
        assert {"free", "free, full logits", "constrained", "constrained, sampled"} <= set(
            row["seconds_per_token"])
    assert set(result["compile"]) == {"cold_s", "cached_s", "matcher_s"}
    assert result["agent_turn"]["prefix_tokens"] >= 256


def run_script(script: str, *args: str) -> None:
    command = [sys.executable, str(BENCHMARKS / script), *args]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]


def test_sliding_window_small(tmp_path):
    out = tmp_path / "sliding.json"
    run_script("sliding_window.py", "--rounds", "1", "--prefix", "256", "--budget",
               str(1 << 30), "--requests", "4", "--prompt", "300", "--skip-smollm2", "--json",
               str(out))  # fmt: skip
    result = json.loads(out.read_text())
    rows = result["kv_bytes_per_sequence"]
    assert [r["context"] for r in rows] == [4096, 32768, 131072]
    assert all(r["hybrid_mib"] < r["every_layer_mib"] for r in rows)
    pool = result["pool"]
    assert pool["hybrid"]["logical_blocks"] > 4 * pool["every_layer"]["logical_blocks"]
    together = result["run_together"]
    assert together["every_layer"]["pool_bytes"] == together["hybrid"]["pool_bytes"]
    assert together["same_answers"] == "4/4"
    assert {"sliding_reference_ms", "global_ms"} <= set(result["decode_attention"][0])
    assert result["prefill_attention"]["sliding_reference_ms"] > 0
    assert result["ttft"]["prefix"] == 256 and result["ttft"]["warm_s"] > 0


def test_router_overhead_decisions(tmp_path):
    out = tmp_path / "overhead.json"
    run_script("router_overhead.py", "--tokens", "1024", "--backends", "3", "--seconds", "0.1",
               "--skip-proxy", "--json", str(out))  # fmt: skip
    decision = json.loads(out.read_text())["decision"]
    assert decision["prompt_tokens"] == 1024 and decision["backends"] == 3
    assert decision["decision_p50_ms"] > 0


def test_reports_record_their_run_and_render_as_markdown(tmp_path):
    out = tmp_path / "fragmentation.json"
    result = run_quick("fragmentation.py", out)
    run = result["run"]
    assert run["cpu"] and run["torch"] == torch.__version__ and run["git_revision"]
    command = [sys.executable, str(BENCHMARKS / "report.py"), str(out)]
    markdown = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert markdown.startswith("## `fragmentation.json`") and run["cpu"] in markdown
    assert "| ratio" in markdown or "### ratios" in markdown


def test_a_report_can_show_some_of_its_entries(tmp_path):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import report
    finally:
        sys.path.remove(str(BENCHMARKS))
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"run": {"cpu": "X"}, "summary": [{"a": 1}], "raw": [{"b": 2}]}))
    shown = report.report_markdown(path, keys=["summary"])
    assert "summary" in shown and "raw" not in shown and "| a |" in shown
    assert "raw" in report.report_markdown(path)
    with pytest.raises(KeyError, match="no other"):
        report.report_markdown(path, keys=["other"])


def test_router_simulate_and_mooncake_replay_small(tmp_path):
    simulated, replayed = tmp_path / "sim.json", tmp_path / "replay.json"
    run_script("router_simulate.py", "--limit", "300", "--json", str(simulated))
    policies = json.loads(simulated.read_text())["replicas_8"]["policies"]
    assert policies["oracle"]["hit_over_oracle"] == 1.0
    assert policies["round_robin"]["p90_times_lower_than_round_robin"] == 1.0
    run_script("mooncake_replay.py", "--limit", "20", "--json", str(replayed))
    targets = json.loads(replayed.read_text())["targets"]
    assert targets["cache off"]["completed"] == targets["cache on"]["completed"] == 20
    assert targets["cache off"]["hit_rate"] == 0.0
