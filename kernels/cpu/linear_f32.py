"""A float32 GEMM on the CPU through the compiled AVX2/FMA kernel (``linear_f32.c``), over a
weight packed once: ``x @ weight.T + bias`` for a float32 engine's projections and output head
on CPUs without native bf16.

``pack_f32_weight`` lays a ``[n_out, k]`` weight out as ``ceil(n_out / 16)`` strips of
``[k, 16]`` (the last zero-padded); ``linear_f32`` multiplies by it. Every output element is one
float32 FMA chain over ``k`` in order (then the bias), so a row's result does not depend on the
other rows of the call; it differs from ``F.linear`` in float32 rounding only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from prefixcache.kernels.cpu.build import load_f32_library

STRIP = 16  # output columns per packed strip


def f32_linear_supports(weight: torch.Tensor) -> bool:
    """True when ``weight`` ([n_out, k]) can run the compiled GEMM: a 2-D CPU float32 tensor,
    and the kernel is available here."""
    return (
        weight.dtype is torch.float32
        and weight.is_cpu
        and weight.dim() == 2
        and load_f32_library() is not None
    )


def pack_f32_weight(weight: torch.Tensor) -> torch.Tensor:  # [ceil(n_out / 16), k, 16]
    """``weight`` [n_out, k] float32 as contiguous strips of 16 output columns."""
    n_out, k = weight.shape
    padded = F.pad(weight.detach().float(), (0, 0, 0, -n_out % STRIP))  # [strips * 16, k]
    return padded.reshape(-1, STRIP, k).transpose(1, 2).contiguous()


def unpack_f32_weight(packed: torch.Tensor, n_out: int) -> torch.Tensor:  # [n_out, k], new
    """The ``[n_out, k]`` weight ``pack_f32_weight`` packed into ``packed``."""
    strips, k, width = packed.shape
    return packed.transpose(1, 2).reshape(strips * width, k)[:n_out].contiguous()


def linear_f32(
    x: torch.Tensor,  # [rows, k] float32
    packed: torch.Tensor,  # [ceil(n_out / 16), k, 16] from pack_f32_weight
    n_out: int,
    bias: torch.Tensor | None = None,  # [n_out] float32
) -> torch.Tensor:  # [rows, n_out] float32
    """``x @ weight.T + bias`` over the packed weight, on ``torch.get_num_threads()`` threads."""
    lib = load_f32_library()
    if lib is None:
        raise RuntimeError("the float32 CPU GEMM is unavailable on this machine")
    strips, k, width = packed.shape
    if width != STRIP or strips != -(-n_out // STRIP) or not packed.is_contiguous():
        raise ValueError(f"packed weight of shape {tuple(packed.shape)} is not {n_out} columns")
    if x.dim() != 2 or x.shape[1] != k or x.dtype is not torch.float32:
        raise ValueError(f"x must be float32 [rows, {k}], got {x.dtype} {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if bias is not None and (bias.shape != (n_out,) or bias.dtype is not torch.float32):
        raise ValueError(f"bias must be float32 [{n_out}], got {bias.dtype} {tuple(bias.shape)}")
    bias = None if bias is None else bias.contiguous()
    out = torch.empty((x.shape[0], n_out), dtype=torch.float32)
    if x.shape[0] == 0:
        return out
    lib.pc_f32_linear(
        x.data_ptr(), x.stride(0), x.shape[0], k,
        packed.data_ptr(), n_out, None if bias is None else bias.data_ptr(),
        out.data_ptr(), out.stride(0), torch.get_num_threads(),
    )  # fmt: skip
    return out
