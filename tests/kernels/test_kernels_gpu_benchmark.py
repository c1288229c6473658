"""benchmarks/kernels_gpu.py is ready to run: it imports, parses, and without CUDA says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels_gpu.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: run the benchmark")
def test_without_cuda_it_exits_2_with_a_message(tmp_path: Path) -> None:
    out = tmp_path / "kernels_gpu.json"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert completed.returncode == 2, completed.stderr
    assert "needs a CUDA GPU" in completed.stderr
    assert not out.exists()
