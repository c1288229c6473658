"""CPU bf16 projections: the compiled GEMM (``prefixcache.kernels.cpu.linear_cpu``) against
oneDNN's packed GEMM (``torch.ops.mkldnn._linear_pointwise`` on a pre-reordered weight).

Two measurements, both side by side in one run (the variants alternate, best of the repeats):

1. streamed: the 121 projections of a SmolLM2-135M forward (30 layers x qkv 960x576, o 576x576,
   gate_up 3072x576, down 576x1536, then the 49152x576 output head), every weight distinct
   (268 MB, far past the caches) as in a forward pass, for 1, 4, 16 and 64 rows; the compiled
   GEMM's weights on ordinary 4 KB pages and, where the machine offers them, on 2 MB pages
   (``HugePageArena``, as the engine places them);
2. hot: one weight repeated (it stays in cache), per shape, for 1 to 1,637 rows: GFLOP/s.

    python benchmarks/cpu_linear.py [--quick] [--threads 2] [--repeats 5] \
        [--out results/cpu_linear.json]

``--quick`` (the tests' smoke run): one and 64 rows only, one repeat.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from bench_report import write_json

from prefixcache.kernels.cpu import (
    HugePageArena,
    cpu_linear_supports,
    huge_pages_available,
    linear_cpu,
)
from prefixcache.kernels.reference.linear import pack_linear_weight

LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) per layer
HEAD_SHAPE = (49152, 576)
LAYERS = 30


def onednn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def repeated(calls: int, fn: Callable[..., Any], *args: Any) -> None:
    for _ in range(calls):
        fn(*args)


def best_of(variants: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Seconds per call of each variant, the best of ``repeats`` alternating rounds."""
    best = {name: float("inf") for name in variants}
    for fn in variants.values():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


STREAMED_ROWS = (1, 4, 16, 64)
HOT_ROWS = (1, 4, 16, 64, 256, 1637)
QUICK_ROWS = (1, 64)


def streamed(repeats: int, row_counts: tuple[int, ...]) -> list[dict[str, Any]]:
    shapes = LAYER_SHAPES * LAYERS + [HEAD_SHAPE]
    weights = [torch.randn(n, k).div_(k**0.5).bfloat16() for n, k in shapes]
    ours = [pack_linear_weight(w) for w in weights]
    arena = HugePageArena() if huge_pages_available() else None
    ours_huge = [arena.copy(packed) for packed in ours] if arena else []
    theirs = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]
    total_bytes = sum(w.numel() * 2 for w in weights)
    del weights
    rows_out = []
    for rows in row_counts:
        inputs = {k: torch.randn(rows, k).bfloat16() for k in {k for _, k in shapes}}

        def run_ours(
            inputs: dict[int, torch.Tensor] = inputs, packed_weights: list[torch.Tensor] = ours
        ) -> None:
            for (n, k), packed in zip(shapes, packed_weights, strict=True):
                linear_cpu(inputs[k], packed, n)

        def run_onednn(inputs: dict[int, torch.Tensor] = inputs) -> None:
            for (_, k), packed in zip(shapes, theirs, strict=True):
                onednn(inputs[k], packed)

        variants = {"compiled": run_ours, "onednn": run_onednn}
        if ours_huge:
            variants["compiled_huge_pages"] = partial(run_ours, inputs, ours_huge)
        t = best_of(variants, repeats)
        row = {
            "rows": rows,
            "compiled_ms": t["compiled"] * 1e3,
            "onednn_ms": t["onednn"] * 1e3,
            "ratio": t["compiled"] / t["onednn"],
            "compiled_weight_gb_s": total_bytes / t["compiled"] / 1e9,
        }
        huge = ""
        if ours_huge:
            row["compiled_huge_pages_ms"] = t["compiled_huge_pages"] * 1e3
            row["huge_vs_4k_pages"] = t["compiled_huge_pages"] / t["compiled"]
            huge = (
                f"; on 2 MB pages {row['compiled_huge_pages_ms']:7.2f} ms "
                f"({row['huge_vs_4k_pages']:.3f}x)"
            )
        rows_out.append(row)
        print(
            f"streamed forward, {rows:4d} rows: compiled {row['compiled_ms']:7.2f} ms "
            f"({row['compiled_weight_gb_s']:4.1f} GB/s of weights), oneDNN "
            f"{row['onednn_ms']:7.2f} ms, ratio {row['ratio']:.2f}{huge}"
        )
    return rows_out


def hot(repeats: int, row_counts: tuple[int, ...]) -> list[dict[str, Any]]:
    results = []
    for n, k in [*LAYER_SHAPES, HEAD_SHAPE]:
        weight = torch.randn(n, k).div_(k**0.5).bfloat16()
        ours = pack_linear_weight(weight)
        theirs = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        for rows in row_counts:
            if n == HEAD_SHAPE[0] and rows > 16:
                continue  # the head computes sampled rows only
            x = torch.randn(rows, k).bfloat16()
            calls = max(1, 2_000_000 // (rows * n))  # enough work per timed sample

            variants = {
                "compiled": partial(repeated, calls, linear_cpu, x, ours, n),
                "onednn": partial(repeated, calls, onednn, x, theirs),
            }
            t = best_of(variants, repeats)
            flops = 2 * rows * n * k * calls
            row = {
                "out": n, "in": k, "rows": rows,
                "compiled_gflops": flops / t["compiled"] / 1e9,
                "onednn_gflops": flops / t["onednn"] / 1e9,
                "ratio": t["compiled"] / t["onednn"],
            }  # fmt: skip
            results.append(row)
            print(
                f"hot {n:5d}x{k:4d}, {rows:4d} rows: compiled {row['compiled_gflops']:5.0f} "
                f"GFLOP/s, oneDNN {row['onednn_gflops']:5.0f}, time ratio {row['ratio']:.2f}"
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 64 rows, one repeat")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/cpu_linear.json"))
    args = parser.parse_args()
    if not cpu_linear_supports(torch.zeros(2, 2, dtype=torch.bfloat16)):
        raise SystemExit("the compiled CPU kernels are unavailable on this machine")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    repeats = 1 if args.quick else args.repeats
    report = {
        "threads": args.threads,
        "quick": args.quick,
        "torch": torch.__version__,
        "streamed": streamed(repeats, QUICK_ROWS if args.quick else STREAMED_ROWS),
        "hot": hot(repeats, QUICK_ROWS if args.quick else HOT_ROWS),
    }
    write_json(args.out, report)


if __name__ == "__main__":
    main()
