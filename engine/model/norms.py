"""RMSNorm, computed in float32 and cast back, exactly as HF Llama does."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from prefixcache.kernels import add_rms_norm_, rms_norm


class RMSNorm(nn.Module):
    """`weight * (x / sqrt(mean(x^2) + eps))`; statistics in float32, output in x's dtype.

    `add_and_norm_` fuses the residual add that precedes every norm of a pre-norm decoder
    (one pass over memory with the compiled CPU ops, see `prefixcache.kernels.model_ops`).
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))  # [hidden]
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """`x` `[num_tokens, hidden]` -> a new `[num_tokens, hidden]`."""
        return rms_norm(x, self.weight, self.eps)

    def add_and_norm_(self, x: Tensor, residual: Tensor) -> Tensor:
        """In place: `residual += x`, then `x = norm(residual)`; returns `x`. Both
        `[num_tokens, hidden]`, not overlapping."""
        return add_rms_norm_(x, residual, self.weight, self.eps)
