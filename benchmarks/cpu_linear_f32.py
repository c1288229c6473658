"""The compiled float32 GEMM (AVX2/FMA, ``prefixcache.kernels.cpu.linear_f32``) against
oneDNN's packed float32 GEMM (``torch.ops.mkldnn._linear_pointwise`` over a reordered weight,
what a float32 engine used before), on SmolLM2-135M's projections.

For each row count (1: decoding one sequence; 32: a decode batch; 64: a warm suffix; 1,637: a
cold prompt), the four projections of a layer (QKV 576->960, o 576->576, gate_up 576->3072,
down 1536->576) run through 30 layers' weights in turn, as a forward pass does, so every GEMM
finds its weight out of cache; the two kernels alternate per repeat, medians reported. "of
peak" holds the compiled GEMM's GFLOP/s against the threads' float32 FMA peak
(``f32_fma_peak``: FMAs alone, on registers; the better of a run before and one after).

    python benchmarks/cpu_linear_f32.py [--threads 2] [--repeats 5] [--quick] \
        [--out results/cpu_linear_f32.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json

from prefixcache.kernels.cpu import (
    f32_fma_peak,
    f32_linear_supports,
    linear_f32,
    pack_f32_weight,
)

SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))  # (in, out) of a layer's GEMMs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="2 layers, 1 repeat (smoke run)")
    parser.add_argument("--out", default="results/cpu_linear_f32.json")
    args = parser.parse_args()
    if not f32_linear_supports(torch.zeros(2, 2)):
        sys.exit("the float32 CPU GEMM is unavailable here (needs AVX2, FMA, gcc)")
    if args.quick:
        args.layers, args.repeats = 2, 1
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    weights = [[torch.randn((n, k), generator=generator) for k, n in SHAPES]
               for _ in range(args.layers)]  # fmt: skip
    ours = [[(pack_f32_weight(w), w.shape[0]) for w in layer] for layer in weights]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, None) for w in layer]
              for layer in weights]  # fmt: skip
    flops_per_row = 2 * sum(k * n for k, n in SHAPES) * args.layers

    def forward_ours(x: dict[int, torch.Tensor]) -> None:
        for layer in ours:
            for (packed, n), (k, _) in zip(layer, SHAPES, strict=True):
                linear_f32(x[k], packed, n)

    def forward_onednn(x: dict[int, torch.Tensor]) -> None:
        for layer in onednn:
            for packed, (k, _) in zip(layer, SHAPES, strict=True):
                torch.ops.mkldnn._linear_pointwise(x[k], packed, None, "none", [], "")

    peak_before = f32_fma_peak(args.threads)
    results = []
    for rows in (1, 32, 64, 1637):
        x = {k: torch.randn((rows, k), generator=generator) for k in {k for k, _ in SHAPES}}
        seconds: dict[str, list[float]] = {"compiled": [], "onednn": []}
        forward_ours(x), forward_onednn(x)  # warm-up
        for _ in range(args.repeats):
            for name, run in (("compiled", forward_ours), ("onednn", forward_onednn)):
                start = time.perf_counter()
                run(x)
                seconds[name].append(time.perf_counter() - start)
        ours_s, onednn_s = (statistics.median(seconds[name]) for name in ("compiled", "onednn"))
        results.append({"rows": rows, "compiled_s": ours_s, "onednn_s": onednn_s,
                        "ratio": ours_s / onednn_s,
                        "compiled_gflops": flops_per_row * rows / ours_s / 1e9,
                        "onednn_gflops": flops_per_row * rows / onednn_s / 1e9})  # fmt: skip
    peak = max(peak_before, f32_fma_peak(args.threads))  # a busy moment only lowers one
    table = Table(title=f"float32 projections of {args.layers} layers, {args.threads} threads "
                        f"(FMA peak {peak:.0f} GFLOP/s)")  # fmt: skip
    for column in ("rows", "compiled ms", "GFLOP/s", "of peak", "oneDNN ms", "GFLOP/s ",
                   "ratio"):  # fmt: skip
        table.add_column(column, justify="right")
    for row in results:
        row["compiled_of_peak"] = row["compiled_gflops"] / peak
        table.add_row(str(row["rows"]), f"{row['compiled_s'] * 1e3:.2f}",
                      f"{row['compiled_gflops']:.1f}", f"{row['compiled_of_peak']:.0%}",
                      f"{row['onednn_s'] * 1e3:.2f}", f"{row['onednn_gflops']:.1f}",
                      f"{row['ratio']:.2f}x")  # fmt: skip
    Console().print(table)
    meta = {"threads": args.threads, "repeats": args.repeats, "layers": args.layers,
            "fma_peak_gflops": peak}  # fmt: skip
    write_json(args.out, {"meta": meta, "rows": results})


if __name__ == "__main__":
    main()
