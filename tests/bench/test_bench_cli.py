"""`prefixcache bench` on the command line: usage errors exit 2 with one message, failures are
reported (exit 1) without a traceback, request lists replay, and one short real SmolLM2 run."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import TINY_VOCAB
from typer.testing import CliRunner

from prefixcache.integrations.bench.target_embedded import EmbeddedTarget
from prefixcache.integrations.cli import build_app

SMALL = [
    "--workload",
    "shared-prefix",
    "--groups",
    "1",
    "--prompts-per-group",
    "2",
    "--system-len",
    "32",
    "--question-len",
    "8",
    "--output-len",
    "2",
    "--no-progress",
]


def invoke(*args: str):
    return CliRunner().invoke(build_app(), ["bench", *args])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "nope"], "unknown workload 'nope'"),
        (["--cache", "maybe"], "--cache takes on, off"),
        (["--slo", "ttft"], "bad SLO"),
        (["--target", "remote"], "--target takes 'embedded'"),
        (["--request-rate", "0"], "request rate must be > 0"),
        (["--workload", "trace"], "needs a trace FILE"),
        (["--groups", "0", "--workload", "shared-prefix"], "num_groups must be a positive"),
        (["--device", "tpu"], "unknown device 'tpu'"),
    ],
)
def test_bad_usage_exits_2_with_one_message(args: list[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())  # rich may wrap the message
    assert "Traceback" not in result.output


def test_bad_trace_line_names_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_token_ids": [1, 2], "max_tokens": 1}\n{"max_tokens": 1}\n')
    result = invoke("--workload", "trace", str(trace))
    assert result.exit_code == 2
    assert "line 2: needs prompt_token_ids or input_length" in " ".join(result.output.split())


def test_unreachable_url_is_reported_not_raised(tmp_path: Path) -> None:
    result = invoke("--url", "http://127.0.0.1:9", *SMALL, "--output-dir", str(tmp_path))
    assert result.exit_code == 1  # nothing succeeded
    assert "Traceback" not in result.output
    assert "ConnectError x2" in result.output
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["targets"][0]["failed"] == 2


def test_saved_request_list_replays_through_the_trace_workload(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    common = [
        "--model",
        str(tiny_model_dir),
        "--vocab-size",
        str(TINY_VOCAB),
        "--dtype",
        "float32",
        "--cache",
        "on",
        "--no-plots",
    ]
    saved = tmp_path / "requests.jsonl"
    first = invoke(
        *common,
        *SMALL,
        "--seed",
        "3",
        "--save-requests",
        str(saved),
        "--output-dir",
        str(tmp_path / "a"),
    )
    assert first.exit_code == 0, first.output
    replay = invoke(
        *common,
        "--workload",
        "trace",
        str(saved),
        "--no-progress",
        "--output-dir",
        str(tmp_path / "b"),
    )
    assert replay.exit_code == 0, replay.output
    a, b = (json.loads((tmp_path / d / "bench.json").read_text())["targets"][0] for d in "ab")
    assert a["input_lens"] == b["input_lens"] == [40, 40]
    assert a["cached_lens"] == b["cached_lens"] == [0, 32]
    assert a["output_lens"] == b["output_lens"] == [2, 2]


def test_real_smollm2_short_run(tmp_path: Path) -> None:
    """The default model, cache off vs on, two prompts sharing a 32-token system prompt."""
    result = invoke(*SMALL, "--vocab-size", "32000", "--output-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "cache off" in result.output and "cache on" in result.output
    record = json.loads((tmp_path / "bench.json").read_text())
    off, on = record["targets"]
    assert off["model_id"] == "smollm2" and off["completed"] == on["completed"] == 2
    assert off["cached_lens"] == [0, 0] and on["cached_lens"] == [0, 32]
    assert on["engine_stats"]["in_use"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bench.json",
        "bench_requests.csv",
        "ttft_distribution.png",
        "ttft_vs_prompt_len.png",
    ]


def test_ctrl_c_exits_130_after_the_partial_report(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = EmbeddedTarget.send

    async def send_then_interrupt(self, request, result) -> None:
        await original(self, request, result)
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends

    monkeypatch.setattr(EmbeddedTarget, "send", send_then_interrupt)
    result = invoke(
        "--model",
        str(tiny_model_dir),
        "--vocab-size",
        str(TINY_VOCAB),
        *SMALL,
        "--output-dir",
        str(tmp_path),
        "--no-plots",
    )
    assert result.exit_code == 130
    assert "INTERRUPTED" in result.output and "1 / 0" in result.output
    assert json.loads((tmp_path / "bench.json").read_text())["targets"][0]["completed"] == 1
