"""benchmarks/kernel_revision.py: another revision's float32 kernels, swapped in for a call."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from kernel_revision import f32_library_at, run_with

import prefixcache.kernels.cpu.paged_attention_f32 as attention_module
from prefixcache.kernels.cpu import f32_attention_available


def test_an_unknown_revision_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no-such-revision"):
        f32_library_at("no-such-revision")


@pytest.mark.skipif(not f32_attention_available(), reason="no float32 CPU attention kernel here")
def test_a_call_runs_on_the_other_library_and_the_module_gets_its_own_back():
    own = attention_module.load_f32_library
    other = f32_library_at("HEAD")
    seen = []

    def call() -> None:
        seen.append(attention_module.load_f32_library())
        q = torch.randn(3, 2, 8)
        attention_module.paged_prefill_attention_f32(
            q, q, q, torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8),
            torch.zeros(1, 1, dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32),
            torch.tensor([0], dtype=torch.int32), 0.5,
        )  # fmt: skip

    run_with(attention_module, other, call)()
    assert seen == [other] and other is not own()
    assert attention_module.load_f32_library is own
