"""Where every benchmark's JSON report goes: one writer, so all of them read the same way.

Every report records the run it came from under ``"run"``: the CPU (model, family, the SIMD
flags that pick kernels), the torch version, the git revision and the time, so a figure quoted
from it (``benchmarks/report.py``) always names its machine and code.
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")


def run_record() -> dict[str, Any]:
    """The machine and code a report comes from."""
    import torch

    from prefixcache.kernels.cpu.kernel_choice import cpu_model

    flags: set[str] = set()
    family = model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "flags" and not flags:
                flags = set(value.split())
            elif key == "cpu family" and not family:
                family = value.strip()
            elif key == "model" and not model:
                model = value.strip()
    except OSError:
        pass
    try:
        revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True, check=True,
                                  cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        revision = "unknown"
    return {
        "cpu": cpu_model(), "cpu_family": family, "cpu_model_number": model,
        "kernel_flags": [flag for flag in KERNEL_FLAGS if flag in flags],
        "machine": platform.machine(), "torch": torch.__version__, "git_revision": revision,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }  # fmt: skip


def write_json(path: Path | str, report: Any) -> Path:
    """Write ``report`` to ``path`` as indented JSON (creating its folder; a dict report gets
    the ``"run"`` record unless it has one) and say so on stdout; returns the path."""
    if isinstance(report, dict) and "run" not in report:
        report = {**report, "run": run_record()}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return target
