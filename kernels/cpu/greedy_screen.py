"""Greedy decoding's argmax over an output head from an int8 copy of it (``greedy_screen.c``).

A few rows' logits are bound by reading the head from memory (SmolLM2: 56 MB of bf16 for each
step). ``GreedyScreen`` holds an int8 copy (half the bytes) with per-column bounds on its
error; ``screened_argmax`` reads that copy to rule out every column that cannot be a row's
argmax, then computes the exact logits of the strips of 64 columns left with ``linear_cpu``,
the kernel the full head runs: the token is bitwise the one
``linear_cpu(x, packed, n).float().argmax(-1)`` gives, ties to the lowest index.

The screen needs AVX512-VNNI beside the compiled kernels (every AVX512-BF16 CPU has it);
``greedy_screen_available()`` says whether it runs here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefixcache.kernels.cpu.build import cpu_flags, load_library
from prefixcache.kernels.cpu.huge_pages import HugePageArena
from prefixcache.kernels.reference.linear import STRIP

SCREEN_ROWS_MAX = 4  # rows one screen takes (beyond, it costs about what the full head does)
# Past this share of the strips left to compute exactly (one thread, each strip read from
# memory), the full head (both threads streaming it) is about as fast.
MAX_EXACT_SHARE = 0.25


def greedy_screen_available() -> bool:
    """True when the compiled kernels run here and the CPU has AVX512-VNNI."""
    return load_library() is not None and "avx512_vnni" in cpu_flags()


@dataclass(frozen=True)
class GreedyScreen:
    """The int8 screening copy of a head ``[out_features, in_features]``.

    ``q`` ``[strips, ceil(in / 4), 64, 4]`` int8: per column i, ``round(w_i / s_i)`` with
    ``s_i = max |w_i| / 127``; ``meta`` ``[4, strips * 64]`` 32-bit words per column: the scale,
    the error bound per unit of ``|x|_1``, ``sum |q_i|`` (float32) and ``128 sum q_i``
    (int32 bits). Built once from the weight by ``GreedyScreen.of``."""

    q: torch.Tensor
    meta: torch.Tensor
    out_features: int
    in_features: int

    @classmethod
    def of(cls, weight: torch.Tensor, arena: HugePageArena | None = None) -> GreedyScreen:
        """The screening copy of ``weight`` ``[out, in]`` (CPU bf16), in ``arena``'s memory when
        one is given; ValueError for anything but a CPU bf16 matrix with at most 65,536 input
        features, RuntimeError where the screen cannot run."""
        if weight.dtype is not torch.bfloat16 or not weight.is_cpu or weight.dim() != 2:
            raise ValueError(f"the head must be a CPU bf16 matrix, got {weight.dtype}")
        out_features, in_features = weight.shape
        if not (0 < in_features <= 65536 and out_features > 0):
            raise ValueError(f"cannot screen a head of shape {tuple(weight.shape)}")
        if not greedy_screen_available():
            raise RuntimeError("the greedy screen needs the compiled kernels and AVX512-VNNI")
        weight = weight.detach().contiguous()
        strips = -(-out_features // STRIP)
        empty = torch.empty if arena is None else arena.empty
        q = empty((strips, -(-in_features // 4), STRIP, 4), dtype=torch.int8)
        meta = empty((4, strips * STRIP), dtype=torch.float32)
        status = load_library().pc_screen_pack(
            weight.data_ptr(), out_features, in_features, q.data_ptr(), meta.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        if status:
            raise ValueError(f"cannot screen a head of shape {tuple(weight.shape)}")
        return cls(q, meta, out_features, in_features)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.meta.nbytes


def screened_argmax(
    x: torch.Tensor,  # [rows, in_features] bf16
    screen: GreedyScreen,
    packed: torch.Tensor,  # [strips, in / 2, 64, 2] bf16: the same head for linear_cpu
    max_exact_strips: int | None = None,
) -> torch.Tensor | None:  # [rows] int64
    """Each row's argmax of ``linear_cpu(x, packed, out_features).float()`` (the lowest index
    among equal maxima), or None when the screen does not pay: more than ``SCREEN_ROWS_MAX``
    rows, a row holding inf or NaN, or more than ``max_exact_strips`` strips of 64 columns
    left to compute exactly (default: ``MAX_EXACT_SHARE`` of the head's)."""
    strips = screen.q.shape[0]
    if max_exact_strips is None:
        max_exact_strips = max(1, int(strips * MAX_EXACT_SHARE))
    tokens, left = _greedy_head(x, screen, packed, max_exact_strips)
    return tokens if left > 0 else None


def strips_left(x: torch.Tensor, screen: GreedyScreen, packed: torch.Tensor) -> int:
    """How many strips of 64 columns the screen leaves to compute exactly for the rows ``x``
    (of ``screen.q.shape[0]``); 0 when it cannot screen them."""
    return max(0, _greedy_head(x, screen, packed, screen.q.shape[0])[1])


def _greedy_head(
    x: torch.Tensor, screen: GreedyScreen, packed: torch.Tensor, max_exact_strips: int
) -> tuple[torch.Tensor, int]:  # tokens [rows] int64, strips left (< 0: not screened)
    rows = x.shape[0]
    if x.dtype is not torch.bfloat16 or not x.is_cpu or x.dim() != 2:
        raise ValueError(f"x must be a 2-D CPU bfloat16 tensor, got {x.dtype} {tuple(x.shape)}")
    if x.shape[1] != screen.in_features or packed.shape[0] != screen.q.shape[0]:
        raise ValueError("x, the screen and the packed head do not fit together")
    tokens = torch.empty(rows, dtype=torch.int64)
    if not 0 < rows <= SCREEN_ROWS_MAX or screen.in_features % 2:
        return tokens, -2
    if x.stride(1) != 1:
        x = x.contiguous()
    left = load_library().pc_greedy_head(
        x.data_ptr(), x.stride(0), rows, screen.q.data_ptr(), screen.meta.data_ptr(),
        packed.data_ptr(), screen.out_features, screen.in_features, max_exact_strips,
        tokens.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return tokens, left
