"""`prefixcache simulate`: table, --json document, --plot, and exit code 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from prefixcache.integrations.cli import app

TRACE = Path(__file__).parents[2] / "benchmarks" / "traces" / "mooncake_synthetic_trace.jsonl.gz"
runner = CliRunner()


def test_simulate_writes_json_and_plot(tmp_path: Path) -> None:
    out, plot = tmp_path / "sim.json", tmp_path / "sim.png"
    result = runner.invoke(app, [
        "simulate", str(TRACE), "--limit", "400", "--replicas", "4",
        "--policy", "cache_aware", "--policy", "round_robin", "--policy", "oracle",
        "--json", str(out), "--plot", str(plot),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert list(document["policies"]) == ["cache_aware", "round_robin", "oracle"]
    for row in document["policies"].values():
        assert {"hit_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "imbalance"} <= set(row)
    assert document["trace"]["requests"] == 400 and document["config"]["replicas"] == 4
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "cache_aware" in result.output and "oracle" in result.output


def test_bad_input_exits_2(tmp_path: Path) -> None:
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"timestamp": 0}\n')
    for args, message in [
        ([str(TRACE), "--policy", "fastest"], "unknown policy"),
        ([str(TRACE), "--replicas", "0"], "replicas"),
        ([str(TRACE), "--limit", "0"], "--limit"),
        ([str(TRACE), "--prefill-tokens-per-s", "0"], "--prefill-tokens-per-s"),
        ([str(tmp_path / "missing.jsonl")], "cannot read"),
        ([str(bad_line)], "line 1"),
    ]:
        result = runner.invoke(app, ["simulate", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output
