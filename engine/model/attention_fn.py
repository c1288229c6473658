"""The attention hook: the model computes projections and RoPE, the caller attends.

The runner implements `AttentionFn` by writing `k`/`v` into its paged KV pool and attending
over each sequence's blocks; `ContiguousAttention` is the single-sequence reference.
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class AttentionFn(Protocol):
    """Attention over a flat varlen batch of new tokens for one decoder layer.

    Contract: `q`/`k` already carry RoPE; tensors may be strided views (the last dim is
    contiguous). The callable must not modify its inputs. Scale is `head_dim ** -0.5`,
    causal within each sequence, keys/values include any cached history it owns.
    """

    def __call__(
        self,
        layer_idx: int,
        q: Tensor,  # [num_tokens, num_heads, head_dim]
        k: Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: Tensor,  # [num_tokens, num_kv_heads, head_dim]
    ) -> Tensor:  # [num_tokens, num_heads, head_dim]
        ...
