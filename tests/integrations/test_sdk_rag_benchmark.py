"""benchmarks/rag_middleware.py end to end on the tiny model: the JSON it promises, and the
middleware's deterministic effect (a higher hit rate). Timings are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "rag_middleware.py"


def test_rag_benchmark_runs_and_the_middleware_raises_the_hit_rate(
        tiny_chat_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "rag.json"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", str(tiny_chat_dir), "--queries", "10",
         "--chunks-per-topic", "3", "--words-per-chunk", "8", "--block-size", "4",
         "--num-blocks", "400", "--dtype", "float32", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(out.read_text())
    assert set(report) == {"model", "workload", "warm_documents_seconds", "arms", "ratios",
                           "run"}
    baseline, middleware = report["arms"]["baseline"], report["arms"]["middleware"]
    assert baseline["queries"] == middleware["queries"] == 10
    assert baseline["prompt_tokens"] == middleware["prompt_tokens"]  # same chunks, same text
    assert middleware["hit_rate"] > baseline["hit_rate"]
    assert "TTFT baseline/middleware" in completed.stdout
