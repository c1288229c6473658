"""The attention hook: the model computes projections and RoPE, the caller attends.

The runner implements `AttentionFn` by writing `k`/`v` into its paged KV pool and attending
over each sequence's blocks; `ContiguousAttention` is the single-sequence reference.

An implementation may also offer `paged_step(layer_idx) -> (PagedStep, k_cache, v_cache) | None`
(see `prefixcache.kernels.cpu.decoder_layer`): the step's inputs and a layer's bf16 CPU pools,
with which a decoder layer may run as one fused compiled call instead of calling the attention
itself.
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class AttentionFn(Protocol):
    """Attention over a flat varlen batch of new tokens for one decoder layer.

    Contract: `q`/`k` already carry RoPE; tensors may be strided views (the last dim is
    contiguous). The callable must not modify its inputs. Scale is `head_dim ** -0.5`,
    causal within each sequence, keys/values include any cached history it owns.

    With `query_rows` (passed by keyword, only by the last layer of a forward that needs
    just some rows' outputs), `q` holds those rows of the batch alone while `k`/`v` still
    hold every row (all of them must be cached); the result has one row per query row.
    An implementation may support only the row sets its caller asks for (the paged runner:
    the rows its step samples from).
    """

    def __call__(
        self,
        layer_idx: int,
        q: Tensor,  # [num_tokens, num_heads, head_dim]
        k: Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: Tensor,  # [num_tokens, num_kv_heads, head_dim]
        *,
        query_rows: Tensor | None = None,  # [num_queries] int64 rows of the batch, ascending
    ) -> Tensor:  # [num_tokens or num_queries, num_heads, head_dim]
        ...
