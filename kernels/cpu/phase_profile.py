"""Where the fused decoder layers spend their time: seconds per phase, summed over the calls
made inside ``phase_profile()``.

    with phase_profile() as seconds:
        llm.generate(...)
    seconds["attention"], seconds["qkv"], ...

The counters are process-wide and are kept by the thread that calls the layers, so profile one
engine at a time. Outside the block the layers pay one branch per phase.

The yardstick for a phase's GFLOP/s is ``peak_rates.bf16_dot_peak()``: how many the threads
reach issuing nothing but the bf16 dot-product instruction the GEMMs and the attention are
built on.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

from prefixcache.kernels.cpu.build import load_library

# The order of the phase enum in cpu_kernels.h.
PHASES = (
    "norms",  # both RMSNorms with their residual adds
    "qkv",  # the QKV projection
    "rope_kv_write",  # RoPE, then the new k/v into the pool
    "attention",  # paged attention, its K/V packing included
    "o_proj",
    "gate_up_silu",  # the gate and up projections with SiLU-and-mul
    "down",
)


@contextmanager
def phase_profile() -> Iterator[dict[str, float]]:
    """Profiles the fused layers run inside the block; the yielded dict holds each phase's
    seconds once the block ends. RuntimeError when the compiled kernels are unavailable."""
    lib = load_library()
    if lib is None:
        raise RuntimeError("the compiled CPU kernels are unavailable on this machine")
    counters = (ctypes.c_double * len(PHASES))()
    lib.pc_profile_read(counters, 1)  # start from zero
    seconds: dict[str, float] = {}
    lib.pc_profile_enable(1)
    try:
        yield seconds
    finally:
        lib.pc_profile_enable(0)
        lib.pc_profile_read(counters, 1)
        seconds.update(zip(PHASES, counters, strict=True))
