"""Engine benchmarks on SmolLM2: TTFT cold vs cached, against transformers on the same weights.

Every ratio is measured side by side in one run (interleaved rounds, medians) on the same
threads. ``--quick`` runs the TTFT part only (what the README's first command runs).

    python benchmarks/engine_bench.py [--quick] [--threads 2] [--device cuda]
                                      [--out results/engine_bench.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json
from bench_timing import MethodTimer
from hf_reference import hf_last_logits, hf_llama_from

from prefixcache.engine import LLM, SamplingParams

FIRST_TOKEN = SamplingParams(max_tokens=1, temperature=0.0)


def text_tokens(llm: LLM, count: int, seed: int) -> list[int]:
    """``count`` token ids of English-like text, different for every seed."""
    rng = np.random.default_rng(seed)
    words = [
        "the",
        "cache",
        "keeps",
        "attention",
        "keys",
        "and",
        "values",
        "of",
        "every",
        "prompt",
        "prefix",
        "so",
        "a",
        "repeated",
        "system",
        "prompt",
        "document",
        "or",
        "tool",
        "schema",
        "is",
        "never",
        "computed",
        "twice",
        "while",
        "the",
        "radix",
        "tree",
        "finds",
        "blocks",
        "by",
        "hash",
        "and",
        "confirms",
        "them",
        "token",
        "by",
        "token",
    ]
    ids: list[int] = []
    while len(ids) < count:
        ids += llm.tokenizer.encode(" ".join(rng.choice(words, 64)) + ". ")
    return ids[:count]


def timed_first_token(llm: LLM, token_ids: list[int]) -> float:
    """Seconds from submitting ``token_ids`` to holding the first sampled token."""
    start = time.perf_counter()
    llm.generate([token_ids], FIRST_TOKEN)
    return time.perf_counter() - start


def timed_hf(model: torch.nn.Module, token_ids: list[int]) -> float:
    start = time.perf_counter()
    hf_last_logits(model, token_ids)
    return time.perf_counter() - start


# (caching on, caching off) runs of the 0%-hit workload: single runs vary by 5-10% on a shared
# 2-core machine, so the median of 10 moved by +-3% between identical runs
ZERO_HIT_ROUNDS = 16
WARM_PAIRS_PER_ROUND = 3  # (warm request, transformers on its suffix) pairs: cheap, noisy
ZERO_HIT_NEW_TOKENS = 32
# every method of the cache the scheduler calls while it serves requests
SCHEDULER_CACHE_CALLS = (
    "match", "count_query", "allocate", "insert", "insert_partial", "release", "fork",
    "copy_on_write", "promote", "find_in_lower_tier",
)


def ttft_section(llm: LLM, hf: torch.nn.Module, rounds: int, lengths: list[int]) -> dict:
    """Cold prefill vs HF; warm 64-token suffix over a cached prefix vs HF on 64 tokens.

    Each round times a cold prompt and HF on it, then WARM_PAIRS_PER_ROUND warm requests, each
    followed by HF on its 64-token suffix, so both sides of every ratio see the same moments
    of a shared machine; ratios are of medians (the warm one also of the fastest of each)."""
    results: dict[str, Any] = {}
    seed = iter(range(10_000, 1_000_000))
    for length in lengths:
        prefix = text_tokens(llm, length, next(seed))
        llm.warm(prefix)  # the prefix every warm round reuses
        samples: dict[str, list[float]] = {"cold": [], "warm": [], "hf_full": [], "hf_suffix": []}
        for _ in range(rounds):
            fresh = text_tokens(llm, length, next(seed))  # nothing of it is cached
            samples["cold"].append(timed_first_token(llm, fresh))
            samples["hf_full"].append(timed_hf(hf, fresh))
            for _ in range(WARM_PAIRS_PER_ROUND):
                suffix = text_tokens(llm, 64, next(seed))
                samples["warm"].append(timed_first_token(llm, prefix + suffix))
                samples["hf_suffix"].append(timed_hf(hf, suffix))
        med = {k: statistics.median(v) for k, v in samples.items()}
        results[str(length)] = {
            "cold_s": med["cold"],
            "warm_s": med["warm"],
            "hf_prefill_s": med["hf_full"],
            "hf_suffix64_s": med["hf_suffix"],
            "cold_vs_hf": med["cold"] / med["hf_full"],
            "warm_vs_hf_suffix64": med["warm"] / med["hf_suffix"],
            "warm_vs_cold": med["warm"] / med["cold"],
            # each side at its quietest moment: what the ratio is on an idle machine
            "warm_min_s": min(samples["warm"]),
            "hf_suffix64_min_s": min(samples["hf_suffix"]),
            "warm_vs_hf_suffix64_min": min(samples["warm"]) / min(samples["hf_suffix"]),
        }
    return results


def throughput(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[float, float]:
    """(output tokens/s, time-averaged stored tokens / allocated block capacity)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine = llm.engine
    for index, prompt in enumerate(prompts):
        llm.check_request(prompt, params, None)
        engine.add_request(f"tp-{time.perf_counter_ns()}-{index}", prompt, params)
    utilization = []
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step(finished_only=True)  # as `generate` runs it: no snapshots of the running
        running = engine.scheduler.running
        blocks = sum(len(r.block_ids) for r in running)
        if blocks:
            stored = sum(r.num_computed_tokens for r in running)
            utilization.append(stored / (blocks * llm.cache.block_size))
    elapsed = time.perf_counter() - start
    return len(prompts) * max_tokens / elapsed, float(np.mean(utilization))


def hf_generate_throughput(hf: torch.nn.Module, prompts: list[list[int]], max_tokens: int) -> float:
    batch = torch.tensor(prompts, device=hf.device)
    start = time.perf_counter()
    with torch.inference_mode():
        hf.generate(
            batch,
            attention_mask=torch.ones_like(batch),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        ).cpu()
    return len(prompts) * max_tokens / (time.perf_counter() - start)


def zero_hit_section(llm: LLM, rounds: int) -> dict[str, float]:
    """Throughput with caching on and off on prompts that share nothing (0% hits), and the
    share of each run's time spent inside the cache's methods; medians over ``rounds`` rounds
    of one run each.

    One engine, caching switched between runs (two engines would also compare where their
    weights landed in memory), each run from an emptied cache. The scheduler's calls into the
    cache are timed in both configurations: the difference of the shares is what caching
    costs, measured directly, where the two throughputs move by 5-10% a run with the machine.
    """
    rates: dict[str, list[float]] = {"on": [], "off": []}
    cache_shares: dict[str, list[float]] = {"on": [], "off": []}
    scheduler = llm.engine.scheduler
    cache_timer = MethodTimer(llm.cache, SCHEDULER_CACHE_CALLS)
    try:
        for round_index in range(rounds):
            order = ("on", "off") if round_index % 2 == 0 else ("off", "on")
            for name in order:
                scheduler.enable_prefix_caching = name == "on"
                llm.cache.reset()
                base = 10_000 * (round_index + 1) + (0 if name == "on" else 5_000)
                unique = [text_tokens(llm, 256, base + i) for i in range(16)]
                cache_timer.take()
                rate = throughput(llm, unique, ZERO_HIT_NEW_TOKENS)[0]
                rates[name].append(rate)
                run_seconds = len(unique) * ZERO_HIT_NEW_TOKENS / rate
                cache_shares[name].append(cache_timer.take() / run_seconds)
    finally:
        scheduler.enable_prefix_caching = True
        cache_timer.remove()
    on_rate, off_rate = statistics.median(rates["on"]), statistics.median(rates["off"])
    on_share = statistics.median(cache_shares["on"])
    off_share = statistics.median(cache_shares["off"])
    return {
        "cache_on_tok_s": on_rate,
        "cache_off_tok_s": off_rate,
        "on_vs_off": on_rate / off_rate,
        # each round's two runs are adjacent in time: a load change between rounds cancels
        "on_vs_off_paired": statistics.median(
            on / off for on, off in zip(rates["on"], rates["off"], strict=True)
        ),
        # share of a run's time spent inside the cache's methods
        "cache_share_on": on_share,
        "cache_share_off": off_share,
        "cache_overhead_share": on_share - off_share,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    llm = LLM(num_blocks=args.num_blocks, device=args.device)
    hf = hf_llama_from("smollm2", llm.dtype).to(llm.device)
    report: dict[str, Any] = {
        "dtype": str(llm.dtype), "threads": args.threads, "device": str(llm.device)
    }
    lengths = [1637] if args.quick else [1637, 4096]
    report["ttft"] = ttft_section(llm, hf, args.rounds, lengths)
    if not args.quick:
        rng = np.random.default_rng(1)
        batch = [text_tokens(llm, 256, 500 + i) for i in range(32)]
        ours, _ = throughput(llm, batch, 128)
        theirs = hf_generate_throughput(hf, batch, 128)
        report["batch32"] = {
            "ours_tok_s": ours,
            "hf_generate_tok_s": theirs,
            "ratio": ours / theirs,
        }
        mixed = [text_tokens(llm, int(n), 900 + i) for i, n in enumerate(rng.integers(40, 600, 24))]
        _, used = throughput(llm, mixed, 48)
        report["kv_utilization"] = used
        report["zero_hit"] = zero_hit_section(llm, ZERO_HIT_ROUNDS)
    return report


def print_report(report: dict[str, Any]) -> None:
    title = f"engine vs transformers ({report['dtype']}, {report['device']}"
    table = Table(title=f"{title}, {report['threads']} threads)")
    for column in ("measure", "ours", "reference", "ratio", "target"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    for length, row in report["ttft"].items():
        table.add_row(
            f"cold TTFT, {length} tokens",
            f"{row['cold_s']:.3f} s",
            f"HF {row['hf_prefill_s']:.3f} s",
            f"{row['cold_vs_hf']:.2f}x",
            "<= 0.8",
        )
        table.add_row(
            f"warm TTFT, 64 new over {length} cached",
            f"{row['warm_s']:.3f} s",
            f"HF 64 tok {row['hf_suffix64_s']:.3f} s",
            f"{row['warm_vs_hf_suffix64']:.2f}x",
            "<= 0.7" if length == "1637" else "",  # the target is set over 1,637 tokens
        )
        table.add_row(
            f"warm / cold, {length}",
            "",
            "",
            f"{row['warm_vs_cold']:.3f}",
            "<= 0.05" if length == "4096" else "",
        )
    if "batch32" in report:
        b = report["batch32"]
        table.add_row(
            "32 x (256 in, 128 out) tokens/s",
            f"{b['ours_tok_s']:.1f}",
            f"HF generate {b['hf_generate_tok_s']:.1f}",
            f"{b['ratio']:.2f}x",
            ">= 2",
        )
        table.add_row("KV stored / allocated", f"{report['kv_utilization']:.1%}", "", "", ">= 95%")
        z = report["zero_hit"]
        table.add_row(
            "0% hits: cache on / off tokens/s",
            f"{z['cache_on_tok_s']:.1f}",
            f"off {z['cache_off_tok_s']:.1f}",
            f"{z['on_vs_off']:.3f}",
            ">= 0.98",
        )
        table.add_row(
            "  the same, median of each round's pair", "", "", f"{z['on_vs_off_paired']:.3f}", ""
        )
        table.add_row(
            "  time inside the cache's methods, on / off",
            f"{z['cache_share_on']:.3%}",
            f"off {z['cache_share_off']:.3%}",
            f"+{z['cache_overhead_share']:.3%}",
            "",
        )
    console = Console()
    console.print(table)
    for length, row in report["ttft"].items():
        console.print(
            f"fastest of each side, warm over {length}: {row['warm_min_s']:.3f} s vs HF "
            f"{row['hf_suffix64_min_s']:.3f} s = {row['warm_vs_hf_suffix64_min']:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="TTFT on 1,637 tokens only")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-blocks", type=int, default=2048)
    parser.add_argument("--device", default=None, help="cpu (default) or cuda")
    parser.add_argument("--out", default="results/engine_bench.json")
    args = parser.parse_args()
    report = run(args)
    print_report(report)
    write_json(args.out, report)


if __name__ == "__main__":
    main()
