"""Greedy tokens straight from the output head: on CPU, an int8 screening copy of the head
rules out the columns that cannot win and only the few strips left are computed exactly
(``prefixcache.kernels.cpu.greedy_screen``), so a greedy step of a few rows reads half the
head's bytes. The token is bitwise the argmax of the full bf16 logits (ties to the lowest id).

``PREFIXCACHE_GREEDY_SCREEN=0`` turns the screen off (it costs an int8 copy of the head:
28 MB for SmolLM2).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from prefixcache.kernels.dispatch import cpu_kernels

from .packed_linear import PackedLinear

if TYPE_CHECKING:
    from prefixcache.kernels.cpu.greedy_screen import GreedyScreen
    from prefixcache.kernels.cpu.huge_pages import HugePageArena


def greedy_screen_enabled() -> bool:
    """False when ``PREFIXCACHE_GREEDY_SCREEN`` is 0/false/off/no (read at each model load)."""
    value = os.environ.get("PREFIXCACHE_GREEDY_SCREEN", "1").strip().lower()
    return value not in ("0", "false", "off", "no")


def build_greedy_screen(
    head: PackedLinear | None, arena: HugePageArena | None = None
) -> GreedyScreen | None:
    """The screening copy (in ``arena`` if given) of a head the compiled bf16 GEMM runs, or
    None (no such head, the screen turned off, or no AVX512-VNNI)."""
    if head is None or not head.compiled or head.bias is not None or not greedy_screen_enabled():
        return None
    kernels = cpu_kernels()
    if not kernels.greedy_screen_available():
        return None
    from prefixcache.kernels.reference.linear import unpack_linear_weight

    weight = unpack_linear_weight(head.packed, head.out_features)
    return kernels.GreedyScreen.of(weight, arena)

