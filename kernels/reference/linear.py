"""A linear layer's weight in the packed layout the compiled CPU GEMM streams, and the product
in plain torch from that layout (the oracle of ``prefixcache.kernels.cpu.linear``).

Layout: ``[ceil(out / 64), in / 2, 64, 2]``: strips of 64 output columns; within a strip, for
each pair of input dims, the 64 columns' pairs side by side (256 contiguous bytes in bf16).
Columns past ``out_features`` are zero. ``in_features`` must be even.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

STRIP = 64  # output columns per packed strip


def pack_linear_weight(
    weight: torch.Tensor,  # [out_features, in_features], in_features even
) -> torch.Tensor:  # [ceil(out / 64), in / 2, 64, 2], contiguous, new
    """The weight in the packed layout (same dtype)."""
    if weight.dim() != 2 or weight.shape[1] % 2 or weight.shape[1] == 0:
        raise ValueError(
            f"the weight must be a 2-D [out, in] matrix with in even, got {tuple(weight.shape)}"
        )
    out_features, in_features = weight.shape
    strips = -(-out_features // STRIP)
    padded = weight.new_zeros((strips * STRIP, in_features))
    padded[:out_features] = weight
    return padded.view(strips, STRIP, in_features // 2, 2).permute(0, 2, 1, 3).contiguous()


def packed_in_features(packed: torch.Tensor, out_features: int) -> int:
    """``in_features`` of a packed weight; ValueError when it cannot hold ``out_features``."""
    if packed.dim() != 4 or not packed.is_contiguous():
        raise ValueError("packed must be a contiguous 4-D tensor from pack_linear_weight")
    strips, pairs, width, two = packed.shape
    if width != STRIP or two != 2 or not 0 < out_features <= strips * STRIP:
        raise ValueError(f"packed {tuple(packed.shape)} does not hold {out_features} outputs")
    return 2 * pairs


def unpack_linear_weight(
    packed: torch.Tensor,  # [ceil(out / 64), in / 2, 64, 2]
    out_features: int,
) -> torch.Tensor:  # [out_features, in_features]
    """The plain weight back from the packed layout."""
    in_features = packed_in_features(packed, out_features)
    return packed.permute(0, 2, 1, 3).reshape(-1, in_features)[:out_features]


def linear_packed_reference(
    x: torch.Tensor,  # [rows, in_features]
    packed: torch.Tensor,  # [ceil(out / 64), in / 2, 64, 2]
    out_features: int,
    bias: torch.Tensor | None = None,  # [out_features]
) -> torch.Tensor:  # [rows, out_features]
    """``x @ W.T + bias`` with ``F.linear`` on the unpacked weight."""
    return F.linear(x, unpack_linear_weight(packed, out_features), bias)
