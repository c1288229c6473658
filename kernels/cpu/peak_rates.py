"""The machine's ceilings the benchmarks hold the kernels' GFLOP/s against: how fast the
threads issue nothing but the instruction a family of kernels is built on, on registers.

``bf16_dot_peak()``: ``vdpbf16ps`` (the AVX-512 library's GEMMs and attention);
``f32_fma_peak()``: the AVX2 ``vfmadd`` on 8 floats (the float32 library's). Each is the best
of ``repeats`` runs of about ``seconds`` (a shared machine only ever slows a run).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

import torch

from prefixcache.kernels.cpu.build import (
    F32_LIBRARY,
    load_f32_library,
    load_library,
    unavailable_reason,
)

PROBE_ROUNDS = 10_000  # about a millisecond: sizes the runs to `seconds`


def _best_rate(measure: Callable[[int, int], float], threads: int | None, seconds: float,
               repeats: int) -> float:
    """The best of ``repeats`` calls of ``measure(team, rounds)`` (GFLOP/s), rounds sized from
    a probe run to take about ``seconds``."""
    team = threads if threads is not None else torch.get_num_threads()
    if team < 1 or seconds <= 0 or repeats < 1:
        raise ValueError("threads, seconds and repeats must be positive")
    start = time.perf_counter()
    measure(team, PROBE_ROUNDS)
    elapsed = max(time.perf_counter() - start, 1e-9)
    rounds = max(PROBE_ROUNDS, int(PROBE_ROUNDS * seconds / elapsed))
    return max(measure(team, rounds) for _ in range(repeats))


def _library(lib: ctypes.CDLL | None, reason: str | None) -> ctypes.CDLL:
    if lib is None:
        raise RuntimeError(f"the compiled CPU kernels are unavailable on this machine: {reason}")
    return lib


def bf16_dot_peak(threads: int | None = None, seconds: float = 0.05, repeats: int = 5) -> float:
    """GFLOP/s of ``threads`` threads (torch's count by default) issuing only independent
    ``vdpbf16ps`` on registers: the ceiling of every bf16 kernel here on this machine.
    RuntimeError when the compiled (AVX-512) kernels are unavailable."""
    lib = _library(load_library(), unavailable_reason())
    return _best_rate(lib.pc_bf16_dot_gflops, threads, seconds, repeats)


def f32_fma_peak(threads: int | None = None, seconds: float = 0.05, repeats: int = 5) -> float:
    """GFLOP/s of ``threads`` threads (torch's count by default) issuing only independent
    256-bit FMAs on registers: the ceiling of every float32 kernel here on this machine.
    RuntimeError when the float32 (AVX2/FMA) kernels are unavailable."""
    lib = _library(load_f32_library(), unavailable_reason(F32_LIBRARY))
    return _best_rate(lib.pc_f32_fma_gflops, threads, seconds, repeats)
