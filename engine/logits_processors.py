"""Logit processing before sampling, batched over the rows that ask for it.

OpenAI's and vLLM's semantics, in vLLM's order: ``logit_bias`` (added), ``min_tokens`` (EOS and
the stop token ids masked while fewer tokens are out), then the penalties: repetition (every
token of the prompt or the output: a positive logit divided by it, a negative one multiplied),
frequency (subtracted once per occurrence in the output) and presence (subtracted once for any
occurrence in the output). A structured output's grammar masks what it does not allow after
these (``GrammarMasks``, applied by the engine); temperature, ``min_p``, top-k and top-p follow
in the sampler.
Each kind runs as one tensor operation over all the rows that use it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prefixcache.engine.request import Request


def rows_to_process(requests: Sequence[Request]) -> list[int]:
    """The rows whose request's params ask for logit processing."""
    return [row for row, request in enumerate(requests) if request.params.modifies_logits]


def process_logits(
    logits: torch.Tensor,  # [rows, vocab] float32, changed in place
    requests: Sequence[Request],  # the request of each row
    eos_token_ids: Sequence[int],
) -> None:
    """Apply each row's logit bias, min_tokens mask and penalties to its logits."""
    vocab = logits.shape[1]
    _add_logit_bias(logits, requests, vocab)
    _mask_early_stops(logits, requests, eos_token_ids, vocab)
    penalized = [row for row, request in enumerate(requests) if _penalizes(request)]
    if penalized:
        logits[penalized] = _penalize(logits[penalized], [requests[r] for r in penalized])


def _add_logit_bias(logits: torch.Tensor, requests: Sequence[Request], vocab: int) -> None:
    rows, tokens, biases = [], [], []
    for row, request in enumerate(requests):
        for token, bias in request.params.logit_bias.items():
            if token < vocab:  # past the vocabulary: nothing to bias (checked on entry)
                rows.append(row)
                tokens.append(token)
                biases.append(float(bias))
    if rows:
        logits.index_put_((torch.tensor(rows), torch.tensor(tokens)),
                          torch.tensor(biases, dtype=logits.dtype), accumulate=True)


def _mask_early_stops(logits: torch.Tensor, requests: Sequence[Request],
                      eos_token_ids: Sequence[int], vocab: int) -> None:
    rows, tokens = [], []
    for row, request in enumerate(requests):
        params = request.params
        if request.num_output_tokens < params.min_tokens:
            stops = set(params.stop_token_ids)
            if not params.ignore_eos:
                stops.update(eos_token_ids)
            for token in stops:
                if token < vocab:
                    rows.append(row)
                    tokens.append(token)
    if rows:
        logits[torch.tensor(rows), torch.tensor(tokens)] = float("-inf")


def _penalizes(request: Request) -> bool:
    params = request.params
    return bool(params.repetition_penalty != 1.0 or params.frequency_penalty
                or params.presence_penalty)


def _penalize(
    logits: torch.Tensor,  # [rows, vocab] float32
    requests: Sequence[Request],
) -> torch.Tensor:  # [rows, vocab] float32
    rows, vocab = logits.shape
    counts = _token_counts([r.tokens[r.num_prompt_tokens:r.num_tokens] for r in requests],
                           rows, vocab)  # [rows, vocab] output occurrences
    repetition = torch.tensor([r.params.repetition_penalty for r in requests])[:, None]
    if bool((repetition != 1.0).any()):
        seen = (counts > 0) | (_token_counts(
            [r.tokens[:r.num_prompt_tokens] for r in requests], rows, vocab) > 0)
        scaled = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, scaled, logits)
    frequency = torch.tensor([r.params.frequency_penalty for r in requests])[:, None]
    presence = torch.tensor([r.params.presence_penalty for r in requests])[:, None]
    return logits - frequency * counts - presence * (counts > 0)


def _token_counts(token_rows: Sequence, rows: int, vocab: int) -> torch.Tensor:
    """[rows, vocab] float32: how often each token id occurs in each row's ids (numpy int32
    arrays); ids outside [0, vocab) are not counted."""
    counts = torch.zeros(rows, vocab)
    ids = [torch.from_numpy(row_ids.astype("int64", copy=False)) for row_ids in token_rows]
    row_index = torch.cat([torch.full((len(t),), row, dtype=torch.int64)
                           for row, t in enumerate(ids)])
    flat = torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64)
    valid = (flat >= 0) & (flat < vocab)
    counts.index_put_((row_index[valid], flat[valid]), torch.ones(int(valid.sum())),
                      accumulate=True)
    return counts
