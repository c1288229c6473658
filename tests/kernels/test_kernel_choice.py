"""The GEMM choice by measurement: the decision rule, the override, the per-machine cache."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from prefixcache.kernels.cpu import kernel_choice
from prefixcache.kernels.cpu.build import load_f32_library, load_library
from prefixcache.kernels.cpu.gemm_candidates import COMPILED, ONEDNN, gemm_candidates
from prefixcache.kernels.cpu.kernel_choice import (
    CHOICE_ENV,
    LIBRARY,
    SDPA,
    AttentionShape,
    KernelChoice,
    Policy,
    ProjectionShape,
    bucket_of,
    choose_kernels,
    decide,
)


def timings(ours: float, theirs: float) -> dict[str, float]:
    return {COMPILED: ours, ONEDNN: theirs}


def test_a_bucket_is_the_largest_not_above_the_rows() -> None:
    assert [bucket_of(r) for r in (0, 1, 3, 4, 63, 64, 1000, 1024, 9000)] == [
        1, 1, 1, 4, 16, 64, 256, 1024, 1024,
    ]  # fmt: skip


def test_onednn_needs_the_margin_and_the_layer_must_gain_as_a_whole() -> None:
    layer = {"qkv": 1.0, "o": 1.0, "gate_up": 4.0, "down": 2.0}  # compiled seconds per op
    seconds = {
        # bucket 1: oneDNN slower everywhere; bucket 64: 5% faster (noise); bucket 1024: 40%
        # faster on the MLP only; bucket 256: 30% faster on qkv only (the layer gains 4%)
        name: {
            1: timings(t, t * 1.3),
            64: timings(t, t * 0.95),
            256: timings(t, t * (0.7 if name == "qkv" else 1.0)),
            1024: timings(t, t * (0.6 if name in ("gate_up", "down") else 1.0)),
        }
        for name, t in layer.items()
    }
    seconds["head"] = {1: timings(1.0, 0.5), 64: timings(1.0, 0.95)}
    # the attention's library is SDPA: 50% faster at 1024 rows keeps the MLP's gain company
    seconds["attention"] = {64: {COMPILED: 1.0, SDPA: 1.2}, 1024: {COMPILED: 8.0, SDPA: 4.0}}
    chosen = decide(seconds)
    for name in layer:
        assert chosen[name][1] == chosen[name][64] == chosen[name][256] == COMPILED
    assert chosen["gate_up"][1024] == chosen["down"][1024] == ONEDNN
    assert chosen["qkv"][1024] == chosen["o"][1024] == COMPILED  # no gain there
    assert chosen["attention"] == {64: COMPILED, 1024: SDPA}
    assert chosen["head"] == {1: ONEDNN, 64: COMPILED}  # the head is no layer op
    choice = KernelChoice(chosen)
    assert choice.layers_fused(1) and choice.layers_fused(300)
    assert not choice.layers_fused(1024) and not choice.layers_fused(5000)
    assert choice.implementation("gate_up", 2000) == ONEDNN
    assert choice.implementation("gate_up", 1023) == COMPILED
    assert "onednn for gate_up from 1024 rows" in choice.summary()


def test_the_override_parses_or_names_the_choices() -> None:
    assert Policy.parse("measured") == Policy("measured")
    assert Policy.parse(" Compiled ") == Policy(COMPILED)
    assert Policy.parse("library>=256") == Policy(LIBRARY, 256)
    assert str(Policy.parse("library>=256")) == "library>=256"
    for bad in ("fast", "onednn", "library>=0", "library>=x", ""):
        with pytest.raises(ValueError, match="measured, compiled, library"):
            Policy.parse(bad)


SHAPES = [
    ProjectionShape("qkv", 96, 64, (1, 64)), ProjectionShape("head", 128, 64, (1,)),
    AttentionShape(4, 2, 64, (64,)),
]  # fmt: skip


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    load_library(), load_f32_library()  # built (or found) in the real cache, not compiled again
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(CHOICE_ENV, "measured")
    return tmp_path


def test_a_forced_policy_measures_nothing(monkeypatch: pytest.MonkeyPatch, cache_home) -> None:
    monkeypatch.setenv(CHOICE_ENV, "library>=64")
    monkeypatch.setattr(kernel_choice, "measure_op", pytest.fail)
    choice = choose_kernels(SHAPES, torch.float32)
    assert choice.source == "env"
    assert choice.chosen == {
        "qkv": {1: COMPILED, 64: ONEDNN}, "head": {1: COMPILED}, "attention": {64: SDPA},
    }  # fmt: skip
    assert choice.implementation("attention", 63) == COMPILED  # below its smallest bucket
    assert not choice.layers_fused(64) and choice.layers_fused(63)
    assert not list(cache_home.rglob("*.json"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_measurement_is_cached_per_machine_and_read_back(
    cache_home: Path, caplog: pytest.LogCaptureFixture, dtype: torch.dtype
) -> None:
    if len(gemm_candidates(torch.zeros(96, 64, dtype=dtype))) < 2:
        pytest.skip(f"only one GEMM runs {dtype} here: nothing to choose")
    with caplog.at_level(logging.INFO, logger=kernel_choice.__name__):
        first = choose_kernels(SHAPES, dtype)
    assert first.source == "measured"
    assert set(first.seconds["qkv"]) == {1, 64}
    assert all(t > 0 for b in first.seconds["qkv"].values() for t in b.values())
    assert set(first.seconds["attention"][64]) == {COMPILED, SDPA}
    assert [r.getMessage() for r in caplog.records if "kernel choice (measured" in r.getMessage()]
    (path,) = cache_home.rglob("kernels-*.json")
    assert path.parent == cache_home / "prefixcache" / "kernels" / "choices"
    stored = json.loads(path.read_text())
    assert stored["key"]["torch"] == torch.__version__ and stored["key"]["dtype"] in str(dtype)
    again = choose_kernels(SHAPES, dtype)
    assert again.source == "cache" and again.chosen == first.chosen
    # another dtype, thread count or shape is another key, another file
    other = [ProjectionShape("qkv", 96, 128, (1,))]
    assert choose_kernels(other, dtype).source == "measured"
    assert len(list(cache_home.rglob("kernels-*.json"))) == 2


def test_a_torn_cache_file_costs_a_new_measurement(cache_home: Path) -> None:
    if len(gemm_candidates(torch.zeros(96, 64))) < 2:
        pytest.skip("only one float32 GEMM runs here")
    choose_kernels(SHAPES, torch.float32)
    (path,) = cache_home.rglob("kernels-*.json")
    path.write_text(path.read_text()[:40])
    assert choose_kernels(SHAPES, torch.float32).source == "measured"
    assert choose_kernels(SHAPES, torch.float32).source == "cache"
