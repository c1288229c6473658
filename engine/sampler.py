"""Turning a row of logits into the next token: greedy, temperature, top-k, top-p, seeds.

Numerically safe for every value ``SamplingParams`` accepts: the scores are float64 (a float32
logit divided by the smallest non-greedy temperature, 1e-5, stays far inside its range), a NaN
logit counts as impossible (-inf), and a row with no finite score at all falls back to the
argmax of what it has (token 0 if nothing), so ``torch.multinomial`` is never handed
probabilities that are not a distribution.
"""

from __future__ import annotations

import math

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
    """Greedy when temperature is (below the greedy epsilon of) 0; otherwise temperature, then
    min-p, then top-k, then top-p. Always a token id in [0, vocab)."""
    if params.greedy:
        return int(torch.argmax(logits))
    scores = torch.nan_to_num(logits.double(), nan=float("-inf")) / params.temperature
    if not torch.isfinite(scores).any():  # nothing to draw from: the row's best, if any
        return int(torch.argmax(scores))
    scores = scores.clamp(max=torch.finfo(torch.float64).max)  # +inf logits: the top scores
    if params.min_p > 0.0:  # relative to the likeliest: log p < log p_max + log min_p
        scores = scores.masked_fill(scores < scores.max() + math.log(params.min_p),
                                    float("-inf"))
    if params.top_k > 0 and params.top_k < scores.shape[0]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        drop = probs.cumsum(-1) - probs > params.top_p  # keep the first
        scores = scores.scatter(0, order, sorted_scores.masked_fill(drop, float("-inf")))
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
