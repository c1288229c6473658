"""The bf16 peak that the benchmarks hold the kernels' GFLOP/s against (``bf16_dot_peak``):
a positive rate for any team size; its speed is the benchmarks' business, not the tests'."""

from __future__ import annotations

import math

import pytest

from prefixcache.kernels.cpu import bf16_dot_peak
from prefixcache.kernels.cpu.build import load_library, unavailable_reason

LIB = load_library()
if LIB is None:
    pytest.skip(
        f"compiled CPU kernels unavailable: {unavailable_reason()}", allow_module_level=True
    )


@pytest.mark.parametrize("threads", [1, 2, 3])  # 3: more threads than this machine's cores
def test_the_peak_is_a_finite_positive_rate(threads: int) -> None:
    rate = bf16_dot_peak(threads, seconds=0.005, repeats=2)
    assert math.isfinite(rate) and rate > 0


@pytest.mark.parametrize(
    "kwargs", [{"threads": 0}, {"seconds": 0.0}, {"repeats": 0}, {"threads": -1}]
)
def test_bad_arguments_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="positive"):
        bf16_dot_peak(**kwargs)
