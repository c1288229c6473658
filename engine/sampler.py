"""Turning a row of logits into the next token: greedy, temperature, top-k, top-p, seeds."""

from __future__ import annotations

import torch

from prefixcache.engine.sampling_params import SamplingParams


def make_generator(seed: int | None, sample_index: int = 0) -> torch.Generator | None:
    """A private generator for sample ``sample_index`` of a request seeded with ``seed`` (a
    validated ``SamplingParams.seed``), reproducible whatever else runs beside it: seeded with
    ``seed + sample_index`` modulo 2**64, the same generator torch makes of a negative seed,
    and never out of its range."""
    if seed is None:
        return None
    generator = torch.Generator()
    generator.manual_seed((seed + sample_index) % 2**64)
    return generator


def sample_token(
    logits: torch.Tensor,  # [vocab] float32
    params: SamplingParams,
    generator: torch.Generator | None,
) -> int:
    """Greedy when temperature is 0; otherwise temperature, then top-k, then top-p."""
    if params.greedy:
        return int(torch.argmax(logits))
    scores = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < scores.shape[0]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_scores, dim=-1) > params.top_p  # keep the first
        scores = scores.scatter(0, order, sorted_scores.masked_fill(drop, float("-inf")))
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
