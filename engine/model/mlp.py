"""SwiGLU feed-forward with the gate and up projections fused into one matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from prefixcache.kernels import silu_and_mul


class SwiGLUMLP(nn.Module):
    """`down(act(gate(x)) * up(x))`, act SiLU (SwiGLU) or, with `activation="gelu_tanh"`,
    tanh-approximated GELU (Gemma's GeGLU); `gate_up_proj.weight` is
    `[2 * intermediate, hidden]` with the gate rows first (the loader concatenates HF's
    gate_proj and up_proj)."""

    def __init__(self, hidden_size: int, intermediate_size: int,
                 activation: str = "silu") -> None:  # fmt: skip
        super().__init__()
        self.intermediate_size = intermediate_size
        self.activation = activation
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """`x` `[num_tokens, hidden]` -> `[num_tokens, hidden]`."""
        gate_up = self.gate_up_proj(x)  # [num_tokens, 2 * intermediate]
        if self.activation == "gelu_tanh":
            gate, up = gate_up.split(self.intermediate_size, dim=-1)
            return self.down_proj(F.gelu(gate, approximate="tanh") * up)
        return self.down_proj(silu_and_mul(gate_up))  # via [num_tokens, intermediate]


def fuse_rows(*weights: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Concatenate projection weights (or biases) along the output dimension, in `dtype`.

    Copies into one preallocated tensor (converting on the fly) rather than `torch.cat`,
    which is several times slower on small multi-threaded CPUs.
    """
    first = weights[0]
    rows = sum(w.shape[0] for w in weights)
    out = torch.empty((rows, *first.shape[1:]), dtype=dtype or first.dtype, device=first.device)
    start = 0
    for weight in weights:
        out[start : start + weight.shape[0]].copy_(weight)
        start += weight.shape[0]
    return out
