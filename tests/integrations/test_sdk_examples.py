"""Every example runs end to end on the tiny model (in process, so torch loads once)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(("script", "expected"), [
    ("serve_openai_client.py", "streamed:"),
    ("sdk_clients.py", "[http] hit rate so far"),
    ("agent_session.py", "branch turn 1:"),
    ("rag_middleware.py", "How long is shipping?"),
])
def test_example_runs(script: str, expected: str, tiny_chat_dir: Path, monkeypatch,
                      capsys) -> None:
    monkeypatch.setattr(sys, "argv", [script, "--model", str(tiny_chat_dir),
                                      "--num-blocks", "512"])
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    assert expected in capsys.readouterr().out
