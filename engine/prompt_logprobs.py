"""Log probabilities of a prompt's own tokens, recomputed from the prompt.

A prefix hit never computes its tokens' logits, and a chunked prefill keeps only the logits
of the rows it samples, so prompt log probabilities (vLLM's ``prompt_logprobs``, the
completions API's ``echo`` with ``logprobs``) are served by running the model over the whole
prompt again, apart from the paged pool: a contiguous per-request KV cache, ``chunk_rows``
query rows at a time, each chunk's logits reduced to log probabilities before the next (a
prompt's whole ``[tokens, vocab]`` logits are never held). This costs a prefill of the prompt,
on the engine's thread, whatever the cache holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from prefixcache.engine.logprobs import token_logprob
from prefixcache.engine.model.contiguous_attention import ContiguousAttention
from prefixcache.engine.model_config import ModelConfig
from prefixcache.engine.outputs import TokenLogprob

CHUNK_ROWS = 256


@torch.inference_mode()
def prompt_token_logprobs(
    model: torch.nn.Module, config: ModelConfig, token_ids: Sequence[int], top: int,
    chunk_rows: int = CHUNK_ROWS,
) -> list[TokenLogprob | None]:  # fmt: skip
    """One entry per prompt token: None for the first (nothing precedes it), then each token's
    log probability given the tokens before it, its rank (1: the likeliest) and the ``top``
    likeliest tokens at that position (ties by lower id, as sampled logprobs)."""
    attention = ContiguousAttention(
        config.num_layers, sliding_window=config.layer_windows,
        scale=config.softmax_scale, softcap=config.attn_logit_softcap,
    )  # fmt: skip
    ids = torch.as_tensor(list(token_ids), dtype=torch.int64)  # [tokens]
    entries: list[TokenLogprob | None] = [None]
    for start in range(0, len(ids) - 1, chunk_rows):  # the rows whose next token is known
        end = min(start + chunk_rows, len(ids) - 1)
        positions = torch.arange(start, end)
        hidden = model(ids[start:end].to(model.device), positions.to(model.device), attention)
        logprobs = torch.log_softmax(model.compute_logits(hidden).float(), dim=-1).cpu()
        tokens = ids[start + 1 : end + 1]  # [rows]: the token each row predicts
        chosen = logprobs.gather(1, tokens[:, None])  # [rows, 1]
        ranks = (logprobs > chosen).sum(dim=1) + 1  # [rows]
        for row, (token, rank) in enumerate(zip(tokens.tolist(), ranks.tolist(), strict=True)):
            entries.append(replace(token_logprob(logprobs[row], token, top), rank=rank))
    return entries
