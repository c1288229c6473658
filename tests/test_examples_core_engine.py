"""The README's core and engine examples run as written (the engine one on SmolLM2)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_core_example(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(EXAMPLES / "core_prefix_cache.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "warm match: PrefixMatch(block_ids=[0, 1], num_tokens=8," in out
    assert "partial_block=2, partial_tokens=2)" in out
    assert "'in_use': 0, 'cached': 3" in out


def test_engine_example_hits_the_system_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(EXAMPLES / "engine_generate.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    cached = [
        int(line.split("cached ")[1].split(",")[0])
        for line in lines
        if "cached " in line and "prompt" in line
    ]
    assert cached[0] == 0 and cached[1] > 0
    assert "in use 0" in lines[-1]
