"""What the Triton kernels share: compile-time choices (quantization mode, the dot dtype) and
the soft-cap of attention scores."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from prefixcache.kernels.quantization import is_quantized

NO_WINDOW = 1 << 30  # the window of a layer without one: more keys than any context

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def quant_mode(dtype: torch.dtype) -> int:
    """0: floating-point pool, 1: fp8 e4m3, 2: int8."""
    if not is_quantized(dtype):
        return 0
    return 2 if dtype == torch.int8 else 1


def dot_dtype(query_dtype: torch.dtype) -> tl.dtype:
    """Operand dtype of the attention ``tl.dot``s: the query's dtype (fp32 accumulation).

    Triton's CPU interpreter computes a bf16 ``tl.dot`` on the raw bits, so under
    ``TRITON_INTERPRET=1`` bf16 operands are widened to fp32 (same values, exact products)."""
    if query_dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        return tl.float32
    return _TL_DTYPES[query_dtype]


@triton.jit
def soft_cap(scores, cap):
    """``cap * tanh(scores / cap)``, tanh written with ``exp`` (Triton has no tanh of its own on
    every backend): ``sign(x) (1 - t) / (1 + t)`` with ``t = exp(-2|x|)``, which never
    overflows (absolute error a few float32 ulps of 1)."""
    x = scores / cap
    t = tl.exp(-2.0 * tl.abs(x))
    magnitude = (1.0 - t) / (1.0 + t)
    return cap * tl.where(x < 0, -magnitude, magnitude)
