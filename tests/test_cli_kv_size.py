"""`prefixcache kv-size`: table and JSON output, presets, explicit shapes, exit code 2."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from prefixcache.integrations.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["kv-size", *args])


def test_json_llama_70b_defaults():
    result = invoke("--model", "llama-70b", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["bytes_per_token"] == 327_680
    assert report["tokens"] == 4096
    assert report["bytes_per_request"] == 1_342_177_280
    assert report["bytes_total"] == 1_342_177_280
    assert [v["attention"] for v in report["variants"]] == ["MHA", "GQA", "MQA"]
    assert [v["num_kv_heads"] for v in report["variants"]] == [64, 8, 1]


def test_table_shows_bytes_and_both_unit_systems():
    result = invoke("--model", "llama-70b", "--dtype", "bf16", "--tokens", "4096")
    assert result.exit_code == 0, result.output
    for text in ("327,680", "1,342,177,280", "1.34 GB", "1.25 GiB", "MHA", "GQA", "MQA"):
        assert text in result.stdout


def test_requests_multiply_the_total():
    result = invoke("--model", "llama-8b", "--requests", "16", "--json")
    report = json.loads(result.stdout)
    assert report["bytes_total"] == 16 * report["bytes_per_request"]
    assert report["variants"][0]["bytes_total"] == 16 * report["variants"][0]["bytes_per_request"]


def test_explicit_shape_and_kv_heads_default_to_heads():
    result = invoke("--layers", "2", "--heads", "4", "--head-dim", "8", "--dtype", "fp32", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["bytes_per_token"] == 2 * 2 * 4 * 8 * 4
    assert report["attention"] == "MHA"


def test_explicit_flag_overrides_preset():
    result = invoke("--model", "llama-70b", "--kv-heads", "64", "--json")
    assert json.loads(result.stdout)["bytes_per_token"] == 2_621_440


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama-70b", "--dtype", "fp64"], "valid dtypes"),
        (["--model", "no-such-model"], "presets"),
        (["--layers", "2", "--heads", "4"], "--head-dim"),
        (["--model", "llama-70b", "--tokens", "0"], "tokens"),
        (["--model", "llama-70b", "--requests", "-3"], "requests"),
        (["--model", "llama-70b", "--kv-heads", "7"], "divide"),
        (["--model", "llama-70b", "--tokens", "many"], "tokens"),
    ],
)
def test_bad_input_exits_2_without_traceback(args, message):
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_real_subprocess_module_entry_point():
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefixcache.integrations.cli",
            "kv-size",
            "--model",
            "llama-70b",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["bytes_per_request"] == 1_342_177_280


def test_real_subprocess_bad_dtype_exits_2():
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefixcache.integrations.cli",
            "kv-size",
            "--dtype",
            "fp64",
            "--model",
            "llama-70b",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2
    assert "Traceback" not in completed.stderr
    assert "fp64" in completed.stderr


def test_sliding_layers_keep_their_window_per_request():
    report = json.loads(invoke("--model", "gemma3-1b", "--tokens", "32768", "--json").stdout)
    per_layer_token = 2 * 1 * 256 * 2  # K and V, one kv head of 256, bf16
    assert report["bytes_per_token"] == 26 * per_layer_token
    assert report["bytes_per_request"] == (4 * 32768 + 22 * 512) * per_layer_token
    contexts = {row["tokens"]: row for row in report["by_context"]}
    assert sorted(contexts) == [4096, 32768, 131072]
    assert contexts[32768]["requests_ratio"] > 5.9  # 5 local : 1 global at 32K
    gqa = next(v for v in report["variants"] if v["is_model"])
    assert gqa["bytes_per_request"] == report["bytes_per_request"]
    table = invoke("--layers", "6", "--heads", "4", "--head-dim", "16", "--sliding-layers", "5",
                   "--window", "512", "--tokens", "2048")
    assert table.exit_code == 0, table.output
    assert "5 of 6 layers slide over 512 tokens" in table.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--layers", "2", "--heads", "4", "--head-dim", "8", "--sliding-layers", "1"],
     "need a window"),
    (["--layers", "2", "--heads", "4", "--head-dim", "8", "--sliding-layers", "3",
      "--window", "16"], "sliding_layers must be"),
])
def test_bad_sliding_shapes_exit_2(args: list[str], message: str):
    result = invoke(*args)
    assert result.exit_code == 2 and message in " ".join(result.output.split())
