"""JSON and CSV schema, PNG plots and the terminal table, from synthetic runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from rich.console import Console

from prefixcache.integrations.bench.metrics import summarize
from prefixcache.integrations.bench.report_files import (
    CSV_COLUMNS,
    bench_record,
    write_csv,
    write_json,
)
from prefixcache.integrations.bench.report_plots import (
    plot_ttft_distribution,
    plot_ttft_vs_prompt_len,
)
from prefixcache.integrations.bench.report_table import results_table
from prefixcache.integrations.bench.request_result import RequestResult
from prefixcache.integrations.bench.runner import TargetRun

VLLM_FIELDS = (
    "duration",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "errors",
    "mean_ttft_ms",
    "median_ttft_ms",
    "std_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "std_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "std_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "median_e2el_ms",
    "std_e2el_ms",
    "p99_e2el_ms",
    "model_id",
    "backend",
)


def make_run(label: str, ttft: float) -> TargetRun:
    results = [
        RequestResult(
            f"q{i}",
            "rag",
            "g",
            100 + 50 * i,
            3,
            start=float(i),
            end=i + ttft + 0.2,
            token_times=[i + ttft, i + ttft + 0.1, i + ttft + 0.2],
            output_tokens=3,
            cached_tokens=16 * i,
            engine_ttft=ttft - 0.001,
        )
        for i in range(4)
    ]
    results.append(RequestResult("q9", "rag", "g", 70, 3, start=9.0, error="HTTP 503: busy"))
    return TargetRun(
        label, "embedded", "tiny", results, 5.0, summarize(results, 5.0), engine_stats={"in_use": 0}
    )


def test_json_has_the_vllm_fields_and_speedups(tmp_path: Path) -> None:
    runs = [make_run("cache off", 0.4), make_run("cache on", 0.1)]
    path = write_json(
        bench_record(runs, {"workload": "rag", "num_prompts": 5}), tmp_path / "out" / "bench.json"
    )
    record = json.loads(path.read_text())
    assert record["workload"] == "rag" and len(record["targets"]) == 2
    for target in record["targets"]:
        assert set(VLLM_FIELDS) <= set(target)
        assert target["completed"] == 4 and target["failed"] == 1
        assert target["errors"] == ["HTTP 503: busy"]
        assert target["input_lens"] == [100, 150, 200, 250]
        assert target["prefix_cache_hit_rate"] == pytest.approx(16 * 6 / 700)
        assert len(target["itls"]) == 4 and len(target["itls"][0]) == 2
    assert record["speedup_vs_baseline"]["cache on"]["mean_ttft"] == pytest.approx(4.0)


def test_csv_has_one_row_per_request(tmp_path: Path) -> None:
    runs = [make_run("cache off", 0.4), make_run("cache on", 0.1)]
    path = write_csv(runs, tmp_path / "requests.csv")
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert len(rows) == 10
    first = rows[5]
    assert (first["target"], first["request_id"], first["success"]) == ("cache on", "q0", "True")
    assert float(first["ttft_ms"]) == pytest.approx(100.0)
    assert float(first["engine_ttft_ms"]) == pytest.approx(99.0)
    assert float(first["tpot_ms"]) == pytest.approx(100.0) and float(first["start_s"]) == 0.0
    failed = rows[9]
    assert failed["success"] == "False" and failed["error"] == "HTTP 503: busy"
    assert failed["ttft_ms"] == "" and failed["cached_tokens"] == ""


def test_plots_are_png_files(tmp_path: Path) -> None:
    runs = [make_run("cache off", 0.4), make_run("cache on", 0.1)]
    for path in (
        plot_ttft_distribution(runs, tmp_path / "a.png"),
        plot_ttft_vs_prompt_len(runs, tmp_path / "b.png"),
    ):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_shows_each_target_and_the_speedup() -> None:
    console = Console(width=120, record=True)
    console.print(results_table([make_run("cache off", 0.4), make_run("cache on", 0.1)], "t"))
    text = console.export_text()
    assert "cache off" in text and "cache on" in text
    assert "4.00x" in text and "4 / 1" in text and "HTTP 503 x1" in text
