"""Log probabilities of sampled tokens: from a row's raw logits (before any processing, as
vLLM reports them by default), the sampled token's and the top ``k``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prefixcache.engine.outputs import TokenLogprob
from prefixcache.engine.request import Request


def raw_logprobs(
    logits: torch.Tensor,  # [rows, vocab] float32, the runner's (before processing)
    requests: Sequence[Request],  # the request of each row
) -> dict[int, torch.Tensor]:  # row -> [vocab] float32 log-softmax
    """The log-softmax of each row whose request asks for log probabilities."""
    rows = [row for row, request in enumerate(requests) if request.params.logprobs is not None]
    if not rows:
        return {}
    values = torch.log_softmax(logits[rows].float(), dim=-1)  # [len(rows), vocab]
    return dict(zip(rows, values, strict=True))


def token_logprob(
    logprobs: torch.Tensor,  # [vocab] float32 log-softmax
    token: int,
    top: int,
) -> TokenLogprob:
    """``token``'s log probability and the ``top`` likeliest tokens', equal ones by lower id
    first (as greedy sampling breaks ties, so a greedy token heads its own list)."""
    best: tuple[tuple[int, float], ...] = ()
    if top:
        values, _ = torch.topk(logprobs, top)
        tied = torch.nonzero(logprobs >= values[-1]).flatten().tolist()  # ids, ascending
        ranked = sorted(tied, key=lambda i: -float(logprobs[i]))  # stable: ids stay in order
        best = tuple((i, float(logprobs[i])) for i in ranked[:top])
    return TokenLogprob(token, float(logprobs[token]), best)
