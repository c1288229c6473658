"""Seeded traces of mixed-length LLM requests (lognormal prompt and output lengths)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Request:
    """One request: prompt tokens to prefill, then output tokens decoded one per step."""

    prompt_len: int
    output_len: int


def make_trace(
    num_requests: int,
    max_model_len: int,
    seed: int,
    prompt_median: float = 512.0,
    prompt_sigma: float = 1.0,
    output_median: float = 128.0,
    output_sigma: float = 1.0,
) -> list[Request]:
    """Lognormal prompt/output lengths; prompt in [1, max-1], prompt + output <= max_model_len."""
    rng = np.random.default_rng(seed)
    prompts = rng.lognormal(math.log(prompt_median), prompt_sigma, num_requests)
    outputs = rng.lognormal(math.log(output_median), output_sigma, num_requests)
    trace = []
    for prompt, output in zip(prompts, outputs, strict=True):
        p = int(min(max(round(prompt), 1), max_model_len - 1))
        o = int(min(max(round(output), 1), max_model_len - p))
        trace.append(Request(p, o))
    return trace


def trace_summary(trace: list[Request]) -> dict[str, float]:
    """Length statistics of a trace, for the benchmark's JSON."""
    prompts = np.array([r.prompt_len for r in trace])
    outputs = np.array([r.output_len for r in trace])
    totals = prompts + outputs
    return {
        "requests": len(trace),
        "prompt_mean": float(prompts.mean()),
        "prompt_p50": float(np.percentile(prompts, 50)),
        "prompt_p99": float(np.percentile(prompts, 99)),
        "output_mean": float(outputs.mean()),
        "output_p50": float(np.percentile(outputs, 50)),
        "total_mean": float(totals.mean()),
        "total_max": int(totals.max()),
    }
