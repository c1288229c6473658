"""The fused compiled decoder layers against the same compiled ops dispatched one by one.

SmolLM2 on CPU in the engine's default dtype there (bf16 where the CPU has AVX512-BF16, else
float32, each with its own compiled library), one engine, the two paths alternating round by
round (the separate path is what the engine runs when the runner offers no ``paged_step``):
decode time per token of one sequence after a 1,637-token cached prompt, and warm TTFT of 64
new tokens over that prompt. Medians of the rounds; both paths give bitwise the same logits
(tested).

    python benchmarks/fused_layer.py [--rounds 6] [--threads 2] [--out results/fused_layer.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json
from engine_bench import text_tokens, timed_first_token

from prefixcache.engine import LLM, SamplingParams
from prefixcache.engine.model_runner import PagedAttention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/fused_layer.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM()
    fused_step = PagedAttention.paged_step
    prompt = text_tokens(llm, 1637, 1)
    llm.warm(prompt)
    decode = SamplingParams(max_tokens=33, temperature=0.0, ignore_eos=True)
    samples: dict[str, dict[str, list[float]]] = {
        mode: {"tpot_s": [], "warm_ttft_s": []} for mode in ("fused", "separate")
    }
    try:
        for round_index in range(args.rounds):
            for mode, seed in (("fused", 0), ("separate", 1)):
                PagedAttention.paged_step = (
                    fused_step if mode == "fused" else lambda self, layer_idx: None
                )
                tpot = llm.generate([prompt], decode)[0].metrics.tpot
                suffix = text_tokens(llm, 64, 1000 + 2 * round_index + seed)  # never cached
                samples[mode]["tpot_s"].append(tpot)
                samples[mode]["warm_ttft_s"].append(timed_first_token(llm, prompt + suffix))
    finally:
        PagedAttention.paged_step = fused_step
    report: dict = {"threads": args.threads, "rounds": args.rounds, "dtype": str(llm.dtype)}
    for mode, values in samples.items():
        report[mode] = {name: statistics.median(v) for name, v in values.items()}
    for name in ("tpot_s", "warm_ttft_s"):
        report[f"{name}_fused_over_separate"] = report["fused"][name] / report["separate"][name]
    print(f"SmolLM2, {llm.dtype}, {args.threads} threads")
    print(
        f"decode per token:   fused {report['fused']['tpot_s'] * 1e3:6.2f} ms   separate "
        f"{report['separate']['tpot_s'] * 1e3:6.2f} ms   ratio "
        f"{report['tpot_s_fused_over_separate']:.2f}"
    )
    print(
        f"warm TTFT (64 new): fused {report['fused']['warm_ttft_s'] * 1e3:6.2f} ms   separate "
        f"{report['separate']['warm_ttft_s'] * 1e3:6.2f} ms   ratio "
        f"{report['warm_ttft_s_fused_over_separate']:.2f}"
    )
    write_json(args.out, report)


if __name__ == "__main__":
    main()
