"""Compile-time choices shared by the Triton kernels: quantization mode and the dot dtype."""

from __future__ import annotations

import os

import torch
import triton.language as tl

from prefixcache.kernels.quantization import is_quantized

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
