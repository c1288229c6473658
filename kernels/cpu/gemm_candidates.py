"""The GEMM implementations a CPU projection can run, each a way to pack a weight once and a
way to multiply by the packed weight, for ``kernel_choice`` to time side by side.

* ``compiled``: this package's GEMM (bf16 ``linear_cpu`` on AVX512-BF16 CPUs, float32
  ``linear_f32`` on AVX2/FMA CPUs). Each output row is computed on its own, so a token's result
  never depends on the other rows of the call (the engine's cached == uncached bitwise rests
  on this).
* ``onednn``: oneDNN through torch (``torch.ops.mkldnn._reorder_linear_weight`` once, then
  ``_linear_pointwise``): the library that reaches AMX tiles on CPUs that have them; bitwise
  ``F.linear``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from prefixcache.kernels.cpu.linear import cpu_linear_supports, linear_cpu
from prefixcache.kernels.cpu.linear_f32 import f32_linear_supports, linear_f32, pack_f32_weight
from prefixcache.kernels.cpu.op_shapes import COMPILED, ONEDNN
from prefixcache.kernels.reference.linear import pack_linear_weight


@dataclass(frozen=True)
class GemmCandidate:
    """One implementation: ``pack(weight [out, in]) -> packed`` (once, at load) and
    ``run(x [rows, in], packed, out_features, bias [out] | None) -> [rows, out]``."""

    name: str
    pack: Callable[[torch.Tensor], torch.Tensor]
    run: Callable[[torch.Tensor, torch.Tensor, int, torch.Tensor | None], torch.Tensor]


def onednn_supports(dtype: torch.dtype) -> bool:
    """Whether oneDNN's packed GEMM runs ``dtype`` here: float32 wherever torch has oneDNN,
    bf16 where oneDNN has a bf16 path (AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX)."""
    if not torch.backends.mkldnn.is_available() or not hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    ):
        return False
    if dtype is torch.bfloat16:
        supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        return supported is not None and bool(supported())
    return dtype is torch.float32


def onednn_pack(weight: torch.Tensor) -> torch.Tensor:  # oneDNN's opaque layout
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def onednn_linear(
    x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None
) -> torch.Tensor:  # [rows, out_features]
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def compiled_candidate(weight: torch.Tensor) -> GemmCandidate | None:
    """The compiled GEMM for a weight of this dtype and shape, or None where it cannot run."""
    if cpu_linear_supports(weight):
        return GemmCandidate(COMPILED, pack_linear_weight, linear_cpu)
    if weight.dtype is torch.float32 and f32_linear_supports(weight):
        return GemmCandidate(COMPILED, pack_f32_weight, linear_f32)
    return None


def gemm_candidates(weight: torch.Tensor) -> dict[str, GemmCandidate]:
    """Every implementation that can run a projection of ``weight`` ([out, in]) here."""
    found = {}
    compiled = compiled_candidate(weight)
    if compiled is not None:
        found[COMPILED] = compiled
    if weight.is_cpu and onednn_supports(weight.dtype):
        found[ONEDNN] = GemmCandidate(ONEDNN, onednn_pack, onednn_linear)
    return found
