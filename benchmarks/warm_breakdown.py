"""Where a warm request's time goes: the fused decoder layers' phases (``phase_profile``), the
output head and everything outside the compiled layers, for 64 new tokens over a cached
1,637-token prefix on SmolLM2 (engine_bench.py's warm case), with each phase's GFLOP/s and its
share of the threads' bf16 peak (``bf16_dot_peak``: only the dot-product instruction the
kernels are built on, issued back to back), and what the request's FLOPs take at that peak.

    python benchmarks/warm_breakdown.py [--quick] [--requests 30] [--prefix 1637]
                                        [--suffix 64] [--out results/warm_breakdown.json]

CPU, bf16, compiled kernels only (the phases are the fused layers'). ``--quick`` (the tests'
smoke run): 3 requests of 16 new tokens over 256.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json
from engine_bench import FIRST_TOKEN, text_tokens

from prefixcache.engine import LLM
from prefixcache.engine.model_config import ModelConfig
from prefixcache.kernels.cpu import PHASES, bf16_dot_peak, phase_profile


def phase_flops(config: ModelConfig, new: int, cached: int) -> dict[str, float]:
    """FLOPs of each GEMM phase and of the attention for ``new`` tokens over ``cached`` ones:
    every layer computes k/v for all new tokens, the last one goes on for the sampled row."""
    hidden, heads, kv_heads = config.hidden_size, config.num_heads, config.num_kv_heads
    head_dim, inter, layers = config.head_dim, config.intermediate_size, config.num_layers
    rows = (layers - 1) * new + 1  # rows past the attention, the sampled row in the last layer
    keys_seen = new * cached + new * (new + 1) // 2  # over the new rows of one layer
    attention = 4 * heads * head_dim * ((layers - 1) * keys_seen + cached + new)
    return {
        "qkv": 2 * layers * new * hidden * (heads + 2 * kv_heads) * head_dim,
        "attention": attention,
        "o_proj": 2 * rows * heads * head_dim * hidden,
        "gate_up_silu": 2 * rows * hidden * 2 * inter,
        "down": 2 * rows * inter * hidden,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    llm = LLM(model="smollm2", dtype="bfloat16")
    model = llm.engine.runner.model
    head_seconds: list[float] = []
    greedy_tokens = model.greedy_tokens  # the head of a greedy step (FIRST_TOKEN is greedy)

    def timed_head(hidden: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        tokens = greedy_tokens(hidden)
        head_seconds.append(time.perf_counter() - start)
        return tokens

    model.greedy_tokens = timed_head
    peak_before = bf16_dot_peak()  # GFLOP/s of torch's threads, the ones the layers run on
    prefix = text_tokens(llm, args.prefix, 1)
    llm.warm(prefix)
    suffixes = [text_tokens(llm, args.suffix, 100 + i) for i in range(args.requests + 3)]
    for suffix in suffixes[:3]:  # settle buffers and caches
        llm.generate([prefix + suffix], FIRST_TOKEN)
    head_seconds.clear()
    totals, computed = [], []
    with phase_profile() as seconds:
        for suffix in suffixes[3:]:
            start = time.perf_counter()
            out = llm.generate([prefix + suffix], FIRST_TOKEN)[0]
            totals.append(time.perf_counter() - start)
            computed.append(len(out.prompt_token_ids) - out.num_cached_tokens)
    n = len(totals)
    per_request = {phase: seconds[phase] / n for phase in PHASES}
    per_request["output_head"] = sum(head_seconds) / n
    layers = sum(per_request[p] for p in PHASES)
    total = sum(totals) / n
    per_request["outside_compiled_layers"] = total - layers - per_request["output_head"]
    new = round(statistics.mean(computed))
    flops = phase_flops(model.config, new, args.prefix + args.suffix - new)
    peak = max(peak_before, bf16_dot_peak())  # a busy moment only lowers one of them
    return {
        "prefix_tokens": args.prefix,
        "suffix_tokens": args.suffix,
        "computed_tokens_mean": statistics.mean(computed),
        "requests": n,
        "request_ms_mean": total * 1e3,
        "request_ms_median": statistics.median(totals) * 1e3,
        "phase_ms": {phase: s * 1e3 for phase, s in per_request.items()},
        "phase_gflops": {
            phase: count / per_request[phase] / 1e9 for phase, count in flops.items()
        },
        "bf16_peak_gflops": peak,
        "request_gflop": sum(flops.values()) / 1e9,
        "ms_at_peak": sum(flops.values()) / peak / 1e6,
    }


def print_report(report: dict[str, Any]) -> None:
    table = Table(
        title=f"warm request: {report['suffix_tokens']} new over {report['prefix_tokens']} "
        f"cached, mean {report['request_ms_mean']:.1f} ms ({report['requests']} requests)"
    )
    for column in ("phase", "ms / request", "share", "GFLOP/s", "of peak"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    total, peak = report["request_ms_mean"], report["bf16_peak_gflops"]
    for phase, ms in report["phase_ms"].items():
        rate = report["phase_gflops"].get(phase)
        rates = ("", "") if rate is None else (f"{rate:.0f}", f"{rate / peak:.0%}")
        table.add_row(phase, f"{ms:.2f}", f"{ms / total:.1%}", *rates)
    console = Console()
    console.print(table)
    console.print(
        f"bf16 peak of the threads: {peak:.0f} GFLOP/s; the request's "
        f"{report['request_gflop']:.1f} GFLOP take {report['ms_at_peak']:.1f} ms at it"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--prefix", type=int, default=1637)
    parser.add_argument("--suffix", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("results/warm_breakdown.json"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.prefix, args.suffix = 3, 256, 16
    report = run(args)
    print_report(report)
    write_json(args.out, report)


if __name__ == "__main__":
    main()
