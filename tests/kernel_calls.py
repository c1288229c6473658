"""Recording which kernels a test's code path calls."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

import pytest

from prefixcache.kernels.dispatch import cpu_kernels

CPU_ATTENTION_NAMES = ("paged_prefill_attention_cpu", "paged_decode_attention_cpu")
CPU_MODEL_OP_NAMES = (
    "rms_norm_cpu", "add_rms_norm_cpu_", "apply_rotary_cpu_", "silu_and_mul_cpu", "store_kv_cpu",
)  # fmt: skip
CPU_GEMM_AND_LAYER_NAMES = ("linear_cpu", "decoder_layers_cpu")


def record_calls(
    monkeypatch: pytest.MonkeyPatch, package: ModuleType, names: Iterable[str]
) -> list[str]:
    """Wrap ``package``'s functions ``names`` (through ``monkeypatch``, undone after the test)
    so each call appends its name to the returned list, then runs the function."""
    calls: list[str] = []
    for name in names:
        original = getattr(package, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(package, name, spy)
    return calls


def record_cpu_kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``record_calls`` on the compiled CPU kernels (attention, elementwise ops, GEMM)."""
    names = CPU_ATTENTION_NAMES + CPU_MODEL_OP_NAMES + CPU_GEMM_AND_LAYER_NAMES
    return record_calls(monkeypatch, cpu_kernels(), names)
