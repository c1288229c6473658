"""Linear layers whose weights are packed once, at load time, into a GEMM kernel's layout (CPU).

``F.linear`` on CPU hands oneDNN a plain row-major weight and lets it reorder the weight on
every call; a pre-packed weight skips that. Two kernels hold packed weights:

* bf16 on a CPU with AVX512-BF16 (and gcc): the compiled GEMM of ``prefixcache.kernels.cpu``
  (weight in strips of 64 output columns, input dims paired). Against oneDNN's packed GEMM on
  a 2-core AVX-512 CPU, SmolLM2's projections with weights streamed from memory: 0.73x the time
  for one row (decode), 0.8-0.9x for 4-64 rows, 0.95-0.98x for long prefills. Sums run in
  another order than oneDNN's, so the last bf16 bit of an output may differ from ``F.linear``.
* float32 on a CPU with AVX2 and FMA (and gcc): the compiled float32 GEMM of
  ``prefixcache.kernels.cpu.linear_f32`` (strips of 16 output columns), each output one FMA
  chain in order, so a row's result does not depend on the rows beside it. Against oneDNN's
  packed GEMM on a 2-core AMD Zen 3, SmolLM2's projections with weights streamed from
  memory: 0.64-0.73x the time for one row, 0.77-0.81x for 32, 0.82-0.85x for 64 and
  1.02-1.06x for 1,637 in two runs (``benchmarks/cpu_linear_f32.py``);
* otherwise (no compiled kernels, or the "reference" backend): oneDNN's own packed layout
  (``torch.ops.mkldnn._reorder_linear_weight``), bitwise-identical to ``F.linear``; measured in
  bf16: 0.45-0.66x the time at 1 row, 0.72-0.88x at 32-64 rows, 0.90-0.94x at 1,637 rows.
  oneDNN packs bf16 only on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; elsewhere (an
  AVX2-only CPU such as AMD Zen 3) bf16 projections stay plain ``nn.Linear``.

Where the machine's measurement (``prefixcache.kernels.cpu.kernel_choice``) finds oneDNN faster
than a compiled GEMM for some row counts (e.g. long prefills on a CPU with AMX), the layer also
holds oneDNN's packing of the weight and runs it for calls of those row counts
(``use_onednn_for``): the weight's memory is then held twice.

``PREFIXCACHE_PACK_WEIGHTS=0`` turns packing off (plain ``nn.Linear``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from prefixcache.kernels.cpu.gemm_candidates import onednn_linear, onednn_pack, onednn_supports
from prefixcache.kernels.cpu.op_shapes import bucket_of
from prefixcache.kernels.dispatch import cpu_kernels, get_kernel_backend
from prefixcache.kernels.reference.linear import pack_linear_weight, unpack_linear_weight

if TYPE_CHECKING:
    from prefixcache.kernels.cpu.huge_pages import HugePageArena

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def packable_dtype(dtype: torch.dtype) -> bool:
    """True when a weight of `dtype` can be packed on this CPU: float32 always, bfloat16 where
    oneDNN's bf16 GEMM runs (its reorder raises on CPUs without AVX-512 or AVX-NE-CONVERT)."""
    if dtype == torch.bfloat16:
        supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        return supported is not None and bool(supported())
    return dtype in PACKABLE_DTYPES


def weight_packing_available() -> bool:
    """True when this torch build has oneDNN's packed linear ops and packing is not disabled."""
    if os.environ.get("PREFIXCACHE_PACK_WEIGHTS", "1") == "0":
        return False
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


class PackedLinear(nn.Module):
    """``x @ weight.T + bias`` with ``weight`` held packed for a GEMM kernel.

    Contract: CPU only, float32 or bfloat16, input ``[num_rows, in_features]`` in the weight's
    dtype. ``compiled`` / ``compiled_f32`` say which kernel runs: the compiled bf16 GEMM, the
    compiled float32 GEMM, or (both False) oneDNN. The packed weight is a tensor outside
    ``state_dict``, set once, here: to change a projection, assign a new ``PackedLinear`` (the
    model's cached fused-layer plan follows module assignments, not writes to ``packed``).
    ``onednn_buckets`` (set by ``use_onednn_for``) are the row-count buckets in which a compiled
    GEMM's layer runs oneDNN instead, over ``onednn_packed``.
    """

    def __init__(
        self, weight: Tensor, bias: Tensor | None, arena: HugePageArena | None = None
    ) -> None:  # weight [out, in]; the compiled GEMM's packed copy goes into `arena` if given
        super().__init__()
        self.out_features, self.in_features = weight.shape
        weight = weight.detach()
        # the backend is chosen once, at load ("reference" keeps the bitwise oneDNN path)
        auto = get_kernel_backend() == "auto"
        self.compiled = auto and cpu_kernels().cpu_linear_supports(weight)
        # the float32 GEMM (AVX2/FMA): its own flag, `compiled` stays the bf16 GEMM's
        self.compiled_f32 = auto and not self.compiled and cpu_kernels().f32_linear_supports(
            weight
        )
        if self.compiled or self.compiled_f32:
            if self.compiled:
                self.packed = pack_linear_weight(weight)  # [ceil(out / 64), in / 2, 64, 2]
            else:
                self.packed = cpu_kernels().pack_f32_weight(weight)  # [ceil(out / 16), in, 16]
            if arena is not None:
                self.packed = arena.copy(self.packed)
        else:
            self.packed = onednn_pack(weight)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.onednn_buckets: frozenset[int] = frozenset()
        self.onednn_packed: Tensor | None = None

    def use_onednn_for(self, buckets: frozenset[int]) -> None:
        """Run oneDNN for calls whose row count falls in ``buckets`` (see ``kernel_choice``);
        an empty set keeps the compiled GEMM for every call and drops oneDNN's copy. Only a
        layer on a compiled GEMM, in a dtype oneDNN runs, takes a choice."""
        if not buckets:
            self.onednn_buckets, self.onednn_packed = frozenset(), None
            return
        if not (self.compiled or self.compiled_f32) or not onednn_supports(self.packed.dtype):
            raise ValueError("only a compiled GEMM's layer in a dtype oneDNN runs can switch")
        if self.onednn_packed is None:
            if self.compiled:
                weight = unpack_linear_weight(self.packed, self.out_features)
            else:
                weight = cpu_kernels().unpack_f32_weight(self.packed, self.out_features)
            self.onednn_packed = onednn_pack(weight)  # [out, in] from the compiled packing
        self.onednn_buckets = frozenset(buckets)

    def forward(self, x: Tensor) -> Tensor:
        """`x` `[num_rows, in_features]` -> `[num_rows, out_features]`."""
        if self.onednn_packed is not None and bucket_of(x.shape[0]) in self.onednn_buckets:
            return onednn_linear(x, self.onednn_packed, self.out_features, self.bias)
        if self.compiled:
            return cpu_kernels().linear_cpu(x, self.packed, self.out_features, self.bias)
        if self.compiled_f32:
            return cpu_kernels().linear_f32(x, self.packed, self.out_features, self.bias)
        return onednn_linear(x, self.packed, self.out_features, self.bias)

    def extra_repr(self) -> str:
        kernel = "compiled bf16 GEMM" if self.compiled else "oneDNN"
        kernel = "compiled float32 GEMM" if self.compiled_f32 else kernel
        if self.onednn_buckets:
            kernel += f", oneDNN at {sorted(self.onednn_buckets)} rows"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kernel}"


def pack_linear_layers(model: nn.Module, arena: HugePageArena | None = None) -> int:
    """Replace every CPU ``nn.Linear`` of ``model`` in a packable dtype by a ``PackedLinear``
    (packed weights in ``arena`` if given); returns how many were replaced (0 when packing is
    unavailable)."""
    if not weight_packing_available():
        return 0
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
        and child.weight.device.type == "cpu"
        and packable_dtype(child.weight.dtype)
    ]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child.weight, child.bias, arena))
    return len(targets)
