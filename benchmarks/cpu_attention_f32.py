"""CPU paged attention in float32: the compiled AVX2/FMA kernel against the torch reference
(gather by block table, then PyTorch's CPU SDPA), the path a float32 engine took before.

SmolLM2-135M shapes (9 query heads over 3 kv heads, head_dim 64, block size 16, shuffled
block ids), float32; the two variants timed alternately in one run, medians reported:

1. cold prefill: one sequence, 1,637 new tokens, no cached context (causal);
2. warm prefill: 64 new tokens over 1,637 cached tokens;
3. the same over 30 layers' pools in turn, as a warm request's forward reads them (from
   memory, not from cache; time per layer), and over 4,096 cached tokens;
4. batched decode: 32 sequences, one query each, 300-400 cached tokens each;
5. the same over 30 layers' pools in turn, as a decode step reads them;
6. decode of one sequence over 1,701 cached tokens.

FLOPs: 4 * heads * head_dim * (query, visible key) pairs; "of peak" holds the kernel's
GFLOP/s against the threads' float32 FMA peak (``f32_fma_peak``: FMAs alone, on registers;
the better of a run before and one after).

With ``--against REV`` the kernel as git revision REV has it is timed too, in the same
rounds, and each case prints the kernel's time over that revision's: how a kernel change
moves it, side by side.

    python benchmarks/cpu_attention_f32.py [--threads 2] [--repeats 9] [--quick] \
        [--against REV] [--out results/cpu_attention_f32.json]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json
from bench_timing import reference_first_medians
from kernel_revision import f32_library_at, run_with

import prefixcache.kernels.cpu.paged_attention_f32 as attention_module
from prefixcache.kernels.cpu import (
    f32_attention_available,
    f32_fma_peak,
    paged_decode_attention_f32,
    paged_prefill_attention_f32,
)
from prefixcache.kernels.reference.paged_attention import (
    paged_decode_attention_reference,
    paged_prefill_attention_reference,
)

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
LAYERS = 30


def pool_for(lengths: list[int], generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """k_cache, v_cache [blocks, BLOCK, KV_HEADS, HEAD_DIM] of random values and block tables
    [num_seqs, max_blocks] int32 at shuffled ids, for sequences of ``lengths`` tokens."""
    per_seq = [-(-n // BLOCK) for n in lengths]
    total = sum(per_seq)
    shape = (total, BLOCK, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=generator)
    v_cache = torch.randn(shape, generator=generator)
    ids = torch.randperm(total, generator=generator).to(torch.int32)
    tables = torch.zeros((len(lengths), max(per_seq)), dtype=torch.int32)
    start = 0
    for seq, count in enumerate(per_seq):
        tables[seq, :count] = ids[start : start + count]
        start += count
    return k_cache, v_cache, tables


def prefill_case(context: int, new: int, generator: torch.Generator) -> dict[str, Callable]:
    k_cache, v_cache, tables = pool_for([max(context, 1)], generator)
    q = torch.randn((new, HEADS, HEAD_DIM), generator=generator)
    k = torch.randn((new, KV_HEADS, HEAD_DIM), generator=generator)
    v = torch.randn((new, KV_HEADS, HEAD_DIM), generator=generator)
    args = (q, k, v, k_cache, v_cache, tables, torch.tensor([0, new], dtype=torch.int32),
            torch.tensor([context], dtype=torch.int32), HEAD_DIM**-0.5)  # fmt: skip
    return {
        "kernel": lambda: paged_prefill_attention_f32(*args),
        "reference": lambda: paged_prefill_attention_reference(*args),
    }


def decode_case(lengths: list[int], generator: torch.Generator) -> dict[str, Callable]:
    k_cache, v_cache, tables = pool_for(lengths, generator)
    q = torch.randn((len(lengths), HEADS, HEAD_DIM), generator=generator)
    args = (q, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32),
            HEAD_DIM**-0.5)  # fmt: skip
    return {
        "kernel": lambda: paged_decode_attention_f32(*args),
        "reference": lambda: paged_decode_attention_reference(*args),
    }


def over_layers(cases: list[dict[str, Callable]]) -> dict[str, Callable]:
    """The variants of ``cases`` (one a layer, each its own pool, as a model's layers are) run
    in turn, so every call finds its pool out of cache; timed per layer."""

    def in_turn(variant: str) -> Callable:
        return lambda: [case[variant]() for case in cases]

    return {"kernel": in_turn("kernel"), "reference": in_turn("reference")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="one repeat (the tests' smoke run)")
    parser.add_argument("--against", metavar="REV", help="also time the kernel as git "
                        "revision REV has it (e.g. HEAD~1), side by side")
    parser.add_argument("--out", default="results/cpu_attention_f32.json")
    args = parser.parse_args()
    if not f32_attention_available():
        sys.exit("the float32 CPU attention kernel is unavailable here (needs AVX2, FMA, gcc)")
    if args.quick:
        args.repeats = 1
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    decode_lengths = torch.randint(300, 401, (32,), generator=generator).tolist()
    # (name, variants, (query, visible key) pairs per call, calls per run)
    cases: list[tuple[str, dict[str, Callable], float, int]] = [
        ("cold prefill, 1,637 tokens", prefill_case(0, 1637, generator), 1637 * 1638 / 2, 1),
        ("64 new over 1,637 cached", prefill_case(1637, 64, generator),
         64 * 1637 + 64 * 65 / 2, 1),
        ("64 new over 1,637 cached, 30 layers' pools",
         over_layers([prefill_case(1637, 64, generator) for _ in range(LAYERS)]),
         64 * 1637 + 64 * 65 / 2, LAYERS),
        ("64 new over 4,096 cached, 30 layers' pools",
         over_layers([prefill_case(4096, 64, generator) for _ in range(LAYERS)]),
         64 * 4096 + 64 * 65 / 2, LAYERS),
        ("decode, 32 sequences x 300-400", decode_case(decode_lengths, generator),
         sum(decode_lengths), 1),
        ("decode, 32 x 300-400, 30 layers' pools",
         over_layers([decode_case(decode_lengths, generator) for _ in range(LAYERS)]),
         sum(decode_lengths), LAYERS),
        ("decode, 1 sequence x 1,701", decode_case([1701], generator), 1701, 1),
    ]  # fmt: skip
    against = f32_library_at(args.against) if args.against else None
    peak_before = f32_fma_peak(args.threads)
    results: list[dict[str, Any]] = []
    for name, variants, pairs, calls in cases:
        if against is not None:
            variants["against"] = run_with(attention_module, against, variants["kernel"])
        seconds = {k: t / calls for k, t in reference_first_medians(variants, args.repeats).items()}
        gflops = 4 * HEADS * HEAD_DIM * pairs / seconds["kernel"] / 1e9
        results.append({"case": name, "kernel_s": seconds["kernel"],
                        "reference_s": seconds["reference"], "kernel_gflops": gflops,
                        "ratio": seconds["kernel"] / seconds["reference"]})  # fmt: skip
        if against is not None:
            results[-1].update(against_s=seconds["against"],
                               vs_against=seconds["kernel"] / seconds["against"])
    peak = max(peak_before, f32_fma_peak(args.threads))  # a busy moment only lowers one
    table = Table(title=f"float32 paged attention, {args.threads} threads (ms, median; FMA "
                        f"peak {peak:.0f} GFLOP/s)")  # fmt: skip
    columns = ["case", "kernel", "GFLOP/s", "of peak", "reference", "kernel / reference"]
    if against is not None:
        columns += [f"at {args.against}", f"kernel / {args.against}"]
    for column in columns:
        table.add_column(column, justify="left" if column == "case" else "right")
    for row in results:
        row["kernel_of_peak"] = row["kernel_gflops"] / peak
        cells = [row["case"], f"{row['kernel_s'] * 1e3:.2f}", f"{row['kernel_gflops']:.0f}",
                 f"{row['kernel_of_peak']:.0%}", f"{row['reference_s'] * 1e3:.2f}",
                 f"{row['ratio']:.2f}x"]  # fmt: skip
        if against is not None:
            cells += [f"{row['against_s'] * 1e3:.2f}", f"{row['vs_against']:.3f}"]
        table.add_row(*cells)
    Console().print(table)
    meta = {"threads": args.threads, "repeats": args.repeats, "dtype": "float32", "heads": HEADS,
            "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "block_size": BLOCK,
            "fma_peak_gflops": peak, "against": args.against}  # fmt: skip
    write_json(args.out, {"meta": meta, "cases": results})


if __name__ == "__main__":
    main()
