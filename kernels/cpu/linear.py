"""``y = x W^T + b`` in bf16 through the compiled kernel (``linear.c``), the weight packed once.

The weight is packed by ``prefixcache.kernels.reference.linear.pack_linear_weight`` (strips of
64 output columns, input dims paired), the order the kernel streams it in; the oracle is
``linear_packed_reference`` there. ``linear_cpu`` accumulates in float32, adds the bias in
float32 and rounds to bf16 once, as ``F.linear`` in bf16 does (summing in another order, so the
last bit may differ). Against oneDNN's packed GEMM on a 2-core AVX-512 CPU (SmolLM2's
projections, weights streamed from memory as in a forward pass): 0.73x the time for one row,
0.8-0.9x for 4-64 rows, 0.95-0.98x for long prefills.
"""

from __future__ import annotations

import torch

from prefixcache.kernels.cpu.build import load_library
from prefixcache.kernels.reference.linear import packed_in_features


def cpu_linear_supports(weight: torch.Tensor) -> bool:
    """True when the kernel can hold ``weight`` ``[out, in]``: a CPU bf16 matrix with an even
    number of input features, and the compiled kernels run here."""
    return (
        weight.dtype is torch.bfloat16
        and weight.is_cpu
        and weight.dim() == 2
        and weight.shape[1] % 2 == 0
        and weight.shape[1] > 0
        and load_library() is not None
    )


def linear_cpu(
    x: torch.Tensor,  # [rows, in_features] bf16, last dim contiguous
    packed: torch.Tensor,  # [ceil(out / 64), in / 2, 64, 2] bf16 from pack_linear_weight
    out_features: int,
    bias: torch.Tensor | None = None,  # [out_features] bf16
) -> torch.Tensor:  # [rows, out_features] bf16, new
    """``x @ W.T + bias`` with ``W`` packed by ``pack_linear_weight``."""
    if packed.dtype is not torch.bfloat16:
        raise ValueError(f"packed must be bfloat16, got {packed.dtype}")
    in_features = packed_in_features(packed, out_features)
    if x.dtype is not torch.bfloat16 or not x.is_cpu or x.dim() != 2:
        raise ValueError(f"x must be a 2-D CPU bfloat16 tensor, got {x.dtype} {tuple(x.shape)}")
    if x.shape[1] != in_features:
        raise ValueError(f"x has {x.shape[1]} features, the weight {in_features}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if bias is not None and not (
        bias.dtype is torch.bfloat16 and bias.shape == (out_features,) and bias.is_contiguous()
    ):
        raise ValueError(f"bias must be a contiguous bfloat16 [{out_features}]")
    lib = load_library()
    if lib is None:
        raise RuntimeError("the compiled CPU kernels are unavailable on this machine")
    rows = x.shape[0]
    out = torch.empty((rows, out_features), dtype=torch.bfloat16)
    if rows:
        lib.pc_linear(
            x.data_ptr(), x.stride(0), rows, in_features // 2, packed.data_ptr(), out_features,
            None if bias is None else bias.data_ptr(), out.data_ptr(), out_features,
            torch.get_num_threads(),
        )  # fmt: skip
    return out
