"""The compiled float32 GEMM (AVX2/FMA, ``prefixcache.kernels.cpu.linear_f32``) against
oneDNN's packed float32 GEMM (``torch.ops.mkldnn._linear_pointwise`` over a reordered weight,
what a float32 engine used before), on SmolLM2-135M's projections.

For each row count (1: decoding one sequence; 32: a decode batch; 64: a warm suffix; 1,637: a
cold prompt), the four projections of a layer (QKV 576->960, o 576->576, gate_up 576->3072,
down 1536->576) run through 30 layers' weights in turn, as a forward pass does, so every GEMM
finds its weight out of cache; the two kernels alternate per repeat, medians reported. "of
peak" holds the compiled GEMM's GFLOP/s against the threads' float32 FMA peak
(``f32_fma_peak``: FMAs alone, on registers; the better of a run before and one after).

With ``--against REV`` the GEMM as git revision REV has it is timed too, in the same rounds
(see ``kernel_revision.py``), and each row count prints the GEMM's time over that revision's.

    python benchmarks/cpu_linear_f32.py [--threads 2] [--repeats 5] [--quick] \
        [--against REV] [--out results/cpu_linear_f32.json]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json
from bench_timing import reference_first_medians
from kernel_revision import f32_library_at, run_with

from prefixcache.kernels.cpu import (
    f32_fma_peak,
    f32_linear_supports,
    linear_f32,
    pack_f32_weight,
)

# the GEMM's module (the package's own ``linear_f32`` attribute is the function of that name)
linear_module = importlib.import_module("prefixcache.kernels.cpu.linear_f32")
SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))  # (in, out) of a layer's GEMMs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="2 layers, 1 repeat (smoke run)")
    parser.add_argument("--against", metavar="REV", help="also time the GEMM as git revision "
                        "REV has it (e.g. HEAD~1), side by side")
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

    against = f32_library_at(args.against) if args.against else None
    peak_before = f32_fma_peak(args.threads)
    results = []
    for rows in (1, 32, 64, 1637):
        x = {k: torch.randn((rows, k), generator=generator) for k in {k for k, _ in SHAPES}}
        variants = {"reference": lambda x=x: forward_onednn(x),
                    "compiled": lambda x=x: forward_ours(x)}  # fmt: skip
        if against is not None:
            variants["against"] = run_with(linear_module, against, variants["compiled"])
        seconds = reference_first_medians(variants, args.repeats)
        ours_s, onednn_s = seconds["compiled"], seconds["reference"]
        results.append({"rows": rows, "compiled_s": ours_s, "onednn_s": onednn_s,
                        "ratio": ours_s / onednn_s,
                        "compiled_gflops": flops_per_row * rows / ours_s / 1e9,
                        "onednn_gflops": flops_per_row * rows / onednn_s / 1e9})  # fmt: skip
        if against is not None:
            results[-1].update(against_s=seconds["against"],
                               vs_against=ours_s / seconds["against"])
    peak = max(peak_before, f32_fma_peak(args.threads))  # a busy moment only lowers one
    table = Table(title=f"float32 projections of {args.layers} layers, {args.threads} threads "
                        f"(FMA peak {peak:.0f} GFLOP/s)")  # fmt: skip
    columns = ["rows", "compiled ms", "GFLOP/s", "of peak", "oneDNN ms", "GFLOP/s ", "ratio"]
    if against is not None:
        columns += [f"at {args.against} ms", f"compiled / {args.against}"]
    for column in columns:
        table.add_column(column, justify="right")
    for row in results:
        row["compiled_of_peak"] = row["compiled_gflops"] / peak
        cells = [str(row["rows"]), f"{row['compiled_s'] * 1e3:.2f}",
                 f"{row['compiled_gflops']:.1f}", f"{row['compiled_of_peak']:.0%}",
                 f"{row['onednn_s'] * 1e3:.2f}", f"{row['onednn_gflops']:.1f}",
                 f"{row['ratio']:.2f}x"]  # fmt: skip
        if against is not None:
            cells += [f"{row['against_s'] * 1e3:.2f}", f"{row['vs_against']:.3f}"]
        table.add_row(*cells)
    Console().print(table)
    meta = {"threads": args.threads, "repeats": args.repeats, "layers": args.layers,
            "fma_peak_gflops": peak, "against": args.against}  # fmt: skip
    write_json(args.out, {"meta": meta, "rows": results})


if __name__ == "__main__":
    main()
