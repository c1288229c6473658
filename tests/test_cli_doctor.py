"""`prefixcache doctor`: the machine report and the kernel table of a model, as text and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_model_factory import HEAD_DIM_64, make_tiny_model_dir
from typer.testing import CliRunner

from prefixcache.integrations.cli import app
from prefixcache.kernels.cpu.build import load_f32_library, load_library
from prefixcache.kernels.cpu.kernel_choice import CHOICE_ENV, PREFILL_BUCKETS, ROW_BUCKETS

runner = CliRunner()


def test_machine_only_names_the_cpu_and_its_ceilings(tmp_path: Path) -> None:
    out = tmp_path / "doctor.json"
    result = runner.invoke(app, ["doctor", "--machine-only", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    machine = report["machine"]
    assert report["kernels"] is None
    assert machine["torch"] == torch.__version__ and machine["cpu"] in result.output
    assert set(machine["flags"]) >= {"avx2", "avx512_bf16", "amx_bf16"}
    assert all(v is None or v > 0 for v in machine["peaks_gflops"].values())
    if load_library() is not None:
        assert machine["libraries"]["bf16 (AVX-512 BF16)"] == "loaded"
        assert machine["peaks_gflops"]["bf16_dot_peak"] > 0


def test_the_table_covers_every_op_and_bucket_and_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make_tiny_model_dir(tmp_path / "model", "llama", **HEAD_DIM_64)
    load_library(), load_f32_library()  # before the cache moves: not compiled again
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(CHOICE_ENV, "measured")
    out = tmp_path / "doctor.json"
    result = runner.invoke(app, ["doctor", "--model", str(folder), "--json", str(out)])
    assert result.exit_code == 0, result.output
    table = json.loads(out.read_text())["kernels"]
    if not table["rows"]:
        pytest.skip("one kernel runs each op of this dtype here: nothing to choose")
    assert "kernels per row count" in result.output and table["policy"] == "measured"
    rows = {row["op"]: [] for row in table["rows"]}
    for row in table["rows"]:
        rows[row["op"]].append(row["rows"])
        library = "sdpa" if row["op"] == "attention" else "onednn"
        assert set(row["seconds"]) == {"compiled", library}
    assert set(rows) >= {"qkv", "o", "gate_up", "down", "head"}
    assert rows["qkv"] == list(ROW_BUCKETS)
    if "attention" in rows:
        assert rows["attention"] == list(PREFILL_BUCKETS)
    assert list((tmp_path / "cache").rglob("kernels-*.json"))  # the next load reads it


def test_an_unknown_model_exits_2() -> None:
    result = runner.invoke(app, ["doctor", "--model", "/no/such/model"])
    assert result.exit_code == 2 and "error" in result.output
