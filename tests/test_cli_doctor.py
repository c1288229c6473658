"""`prefixcache doctor`: the machine report and the GEMM table of a model, as text and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_model_factory import HEAD_DIM_64, make_tiny_model_dir
from typer.testing import CliRunner

from prefixcache.integrations.cli import app
from prefixcache.kernels.cpu.build import load_f32_library, load_library
from prefixcache.kernels.cpu.kernel_choice import CHOICE_ENV, ROW_BUCKETS

runner = CliRunner()


def test_machine_only_names_the_cpu_and_its_ceilings(tmp_path: Path) -> None:
    out = tmp_path / "doctor.json"
    result = runner.invoke(app, ["doctor", "--machine-only", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    machine = report["machine"]
    assert report["gemm"] is None
    assert machine["torch"] == torch.__version__ and machine["cpu"] in result.output
    assert set(machine["flags"]) >= {"avx2", "avx512_bf16", "amx_bf16"}
    assert all(v is None or v > 0 for v in machine["peaks_gflops"].values())
    if load_library() is not None:
        assert machine["libraries"]["bf16 (AVX-512 BF16)"] == "loaded"
        assert machine["peaks_gflops"]["bf16_dot_peak"] > 0


def test_the_gemm_table_covers_every_projection_and_bucket_and_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make_tiny_model_dir(tmp_path / "model", "llama", **HEAD_DIM_64)
    load_library(), load_f32_library()  # before the cache moves: not compiled again
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(CHOICE_ENV, "measured")
    out = tmp_path / "doctor.json"
    result = runner.invoke(app, ["doctor", "--model", str(folder), "--json", str(out)])
    assert result.exit_code == 0, result.output
    gemm = json.loads(out.read_text())["gemm"]
    if not gemm["rows"]:
        pytest.skip("one GEMM runs this dtype here: nothing to choose")
    assert "GEMM per row count" in result.output and gemm["policy"] == "measured"
    kinds = {row["projection"] for row in gemm["rows"]}
    assert kinds == {"qkv", "o", "gate_up", "down", "head"}
    qkv = [row["rows"] for row in gemm["rows"] if row["projection"] == "qkv"]
    assert qkv == list(ROW_BUCKETS)
    assert all(set(row["seconds"]) == {"compiled", "onednn"} for row in gemm["rows"])
    assert list((tmp_path / "cache").rglob("gemm-*.json"))  # the next load reads it


def test_an_unknown_model_exits_2() -> None:
    result = runner.invoke(app, ["doctor", "--model", "/no/such/model"])
    assert result.exit_code == 2 and "error" in result.output
