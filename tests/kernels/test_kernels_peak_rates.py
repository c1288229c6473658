"""The peaks that the benchmarks hold the kernels' GFLOP/s against (``bf16_dot_peak``,
``f32_fma_peak``): a positive rate for any team size; their speed is the benchmarks'
business, not the tests'."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from prefixcache.kernels.cpu import bf16_dot_peak, f32_fma_peak
from prefixcache.kernels.cpu.build import (
    F32_LIBRARY,
    load_f32_library,
    load_library,
    unavailable_reason,
)

PEAKS = [
    pytest.param(bf16_dot_peak, id="bf16_dot", marks=pytest.mark.skipif(
        load_library() is None, reason=f"no AVX-512 kernels: {unavailable_reason()}")),
    pytest.param(f32_fma_peak, id="f32_fma", marks=pytest.mark.skipif(
        load_f32_library() is None,
        reason=f"no float32 kernels: {unavailable_reason(F32_LIBRARY)}")),
]


@pytest.mark.parametrize("peak", PEAKS)
@pytest.mark.parametrize("threads", [1, 2, 3])  # 3: more threads than this machine's cores
def test_the_peak_is_a_finite_positive_rate(peak: Callable[..., float], threads: int) -> None:
    rate = peak(threads, seconds=0.005, repeats=2)
    assert math.isfinite(rate) and rate > 0


@pytest.mark.parametrize("peak", PEAKS)
@pytest.mark.parametrize(
    "kwargs", [{"threads": 0}, {"seconds": 0.0}, {"repeats": 0}, {"threads": -1}]
)
def test_bad_arguments_are_refused(peak: Callable[..., float], kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="positive"):
        peak(**kwargs)
