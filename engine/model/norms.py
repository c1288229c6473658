"""RMSNorm, computed in float32 and cast back, exactly as HF Llama does."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """`weight * (x / sqrt(mean(x^2) + eps))`; statistics in float32, output in x's dtype."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))  # [hidden]
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """`x` `[num_tokens, hidden]` -> `[num_tokens, hidden]`."""
        input_dtype = x.dtype
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)  # [num_tokens, 1]
        normed = x32 * torch.rsqrt(variance + self.eps)
        return self.weight * normed.to(input_dtype)
