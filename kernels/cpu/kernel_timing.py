"""Timing the candidate implementations of a model's ops on this machine, for ``kernel_choice``:
each op's candidates interleaved in rounds on the op's real shapes (random values: the time does
not depend on them), the median per candidate.

Projections (``ProjectionShape``): the compiled GEMM and oneDNN (``gemm_candidates``). A bucket
of at most ``STREAMED_ROWS`` rows cycles through distinct weight copies bigger than the caches,
as a decode step streams the weights from memory; larger buckets are compute-bound and run on
one hot copy. Prefill attention (``AttentionShape``): the compiled kernel and SDPA in the model's
dtype, over a paged pool, a prompt of the bucket's length with nothing cached.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping

import torch

from prefixcache.kernels.cpu.gemm_candidates import gemm_candidates
from prefixcache.kernels.cpu.op_shapes import (
    COMPILED,
    SDPA,
    AttentionShape,
    OpShape,
    ProjectionShape,
)

STREAMED_ROWS = 16  # buckets up to this stream their weights from memory (decode-like)
STREAMED_BYTES = 48 << 20  # distinct weight copies per timing pass in the streamed buckets
MAX_COPIES = 64  # (at most this many: a tiny weight's calls are dominated by their overhead)
ROUNDS = 5
BLOCK_SIZE = 16  # the timing pool's


def measure_op(shape: OpShape, dtype: torch.dtype, rounds: int = ROUNDS
               ) -> dict[int, dict[str, float]]:  # fmt: skip
    """Seconds per call of every candidate of ``shape``'s op, per bucket ({} when fewer than
    two candidates run here)."""
    if isinstance(shape, AttentionShape):
        return measure_attention(shape, dtype, rounds)
    return measure_projection(shape, dtype, rounds)


def median_seconds(calls: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Seconds per call of each function: one warm-up each, then ``rounds`` rounds in which
    every function runs once, the order rotating; the median per function."""
    for call in calls.values():
        call()
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _run_all(run: Callable[..., torch.Tensor], x: torch.Tensor, weights: list[torch.Tensor],
             out_features: int) -> None:
    for packed in weights:
        run(x, packed, out_features, None)


def measure_projection(
    shape: ProjectionShape, dtype: torch.dtype, rounds: int = ROUNDS
) -> dict[int, dict[str, float]]:
    """Seconds per call of every candidate GEMM on ``shape`` at each of its buckets (random
    weights of the real shape; timing does not depend on their values)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(shape.out_features, shape.in_features, generator=generator)
    weight = weight.to(dtype)
    candidates = gemm_candidates(weight)
    if not candidates:
        return {}
    weight_bytes = weight.numel() * weight.element_size()
    copies = min(MAX_COPIES, max(1, -(-STREAMED_BYTES // weight_bytes)))
    streamed = {
        name: [c.pack(weight) for _ in range(copies)] for name, c in candidates.items()
    }
    hot = {name: packs[:1] for name, packs in streamed.items()}
    seconds: dict[int, dict[str, float]] = {}
    for bucket in shape.buckets:
        x = torch.randn(bucket, shape.in_features, generator=generator).to(dtype)
        packs = streamed if bucket <= STREAMED_ROWS else hot
        calls = {
            name: functools.partial(_run_all, candidates[name].run, x, packs[name],
                                    shape.out_features)
            for name in candidates
        }  # fmt: skip
        passes = median_seconds(calls, rounds)
        seconds[bucket] = {n: passes[n] / len(packs[n]) for n in candidates}
    return seconds



def attention_candidates(dtype: torch.dtype) -> dict[str, Callable[..., torch.Tensor]]:
    """Prefill attention implementations that run ``dtype`` here: the compiled kernel (bf16 on
    AVX512-BF16 CPUs, float32 on AVX2/FMA ones) and SDPA."""
    from prefixcache.kernels.cpu.paged_attention import (
        cpu_attention_available,
        paged_prefill_attention_cpu,
    )
    from prefixcache.kernels.cpu.paged_attention_f32 import (
        f32_attention_available,
        paged_prefill_attention_f32,
    )
    from prefixcache.kernels.reference.paged_attention import paged_prefill_attention_sdpa

    if dtype is torch.bfloat16 and cpu_attention_available():
        return {COMPILED: paged_prefill_attention_cpu, SDPA: paged_prefill_attention_sdpa}
    if dtype is torch.float32 and f32_attention_available():
        return {COMPILED: paged_prefill_attention_f32, SDPA: paged_prefill_attention_sdpa}
    return {}


def measure_attention(shape: AttentionShape, dtype: torch.dtype, rounds: int = ROUNDS
                      ) -> dict[int, dict[str, float]]:  # fmt: skip
    """Seconds per call of each prefill attention candidate, a prompt of each bucket's length
    over an empty context (causal over itself), written in a paged pool."""
    candidates = attention_candidates(dtype)
    if len(candidates) < 2:
        return {}
    generator = torch.Generator().manual_seed(0)
    seconds: dict[int, dict[str, float]] = {}
    for tokens in shape.buckets:
        blocks = -(-tokens // BLOCK_SIZE)

        def randn(*size: int) -> torch.Tensor:
            return torch.randn(*size, generator=generator).to(dtype)

        q = randn(tokens, shape.heads, shape.head_dim)
        k, v = (randn(tokens, shape.kv_heads, shape.head_dim) for _ in range(2))
        pool = (blocks, BLOCK_SIZE, shape.kv_heads, shape.head_dim)
        k_cache, v_cache = randn(*pool), randn(*pool)
        args = (
            q, k, v, k_cache, v_cache, torch.arange(blocks, dtype=torch.int32)[None],
            torch.tensor([0, tokens], dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
            shape.head_dim**-0.5,
        )  # fmt: skip
        calls = {name: functools.partial(fn, *args) for name, fn in candidates.items()}
        seconds[tokens] = median_seconds(calls, rounds)
    return seconds
