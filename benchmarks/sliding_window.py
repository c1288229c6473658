"""Sliding-window layers: KV bytes per sequence, decode attention time per layer type against
the context, and TTFT cold vs warm on a shared prefix, for Gemma-3-shaped models.

    python benchmarks/sliding_window.py [--json results/sliding_window.json]

1. KV bytes per sequence at 4K / 32K / 128K tokens for Gemma 3 1B's shape (26 layers, 5 local :
   1 global, window 512, 1 KV head of 256, bf16): what the engine's pool holds today (every
   layer keeps every block) and what per-group block release would hold (sliding layers keep
   the window only). The second column is arithmetic, not a measurement: that release is not
   built yet.
2. Decode attention of one layer at 4K and 32K tokens of context (bf16, 8 sequences, block
   16; best of ``--rounds``, the two alternated): a sliding layer (the torch reference) reads
   only its window's blocks, a global layer (the compiled kernel where the CPU has one) the
   whole context.
3. TTFT on a tiny Gemma-3-shaped model (random weights, 6 layers, window 512): an 8K-token
   prompt cold, then the same 8K prefix with 64 new tokens (a prefix hit).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bench_report import write_json

from prefixcache.engine import LLM, SamplingParams
from prefixcache.kernels import paged_decode_attention
from prefixcache.kernels.cpu.kernel_choice import cpu_model

GEMMA3_1B = {"layers": 26, "pattern": 6, "window": 512, "kv_heads": 1, "head_dim": 256}


def kv_bytes(contexts: list[int]) -> list[dict[str, Any]]:
    shape = GEMMA3_1B
    per_token_layer = 2 * shape["kv_heads"] * shape["head_dim"] * 2  # K and V, bf16
    full_layers = shape["layers"] // shape["pattern"]
    sliding_layers = shape["layers"] - full_layers
    rows = []
    for context in contexts:
        today = shape["layers"] * context * per_token_layer
        window = min(context, shape["window"] + 16)  # the window plus one partial block
        grouped = (full_layers * context + sliding_layers * window) * per_token_layer
        rows.append({"context": context, "engine_today_mib": round(today / 2**20, 1),
                     "with_group_release_mib": round(grouped / 2**20, 1),
                     "sequences_ratio": round(today / grouped, 2)})  # fmt: skip
    return rows


def decode_times(contexts: list[int], rounds: int) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    seqs, heads, kv_heads, dim, block = 8, 4, 1, 256, 16
    rows = []
    for context in contexts:
        blocks = seqs * (context // block + 1)
        k_cache = torch.randn(blocks, block, kv_heads, dim, dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        tables = torch.arange(blocks, dtype=torch.int32).reshape(seqs, -1)
        lengths = torch.full((seqs,), context, dtype=torch.int32)
        q = torch.randn(seqs, heads, dim, dtype=torch.bfloat16)
        arguments = (q, k_cache, v_cache, tables, lengths, 256**-0.5)
        windows = {"sliding": GEMMA3_1B["window"], "global": None}
        times: dict[str, list[float]] = {name: [] for name in windows}
        for warm_up in (True, False):  # one untimed pass of each first, then A B A B
            for _ in range(1 if warm_up else rounds):
                for name, window in windows.items():
                    started = time.perf_counter()
                    paged_decode_attention(*arguments, sliding_window=window)
                    if not warm_up:
                        times[name].append(time.perf_counter() - started)
        rows.append({"context": context, **{f"{name}_ms": round(min(t) * 1e3, 3)
                                            for name, t in times.items()}})  # fmt: skip
    return rows


def ttft(prefix: int, suffix: int, rounds: int) -> dict[str, Any]:
    from tiny_model_factory import make_tiny_model_dir

    with tempfile.TemporaryDirectory() as folder:
        model = make_tiny_model_dir(
            Path(folder), "gemma3", hidden_size=256, intermediate_size=512,
            num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
            sliding_window=512, max_position_embeddings=2 * prefix, vocab_size=384,
        )  # fmt: skip
        first = SamplingParams(max_tokens=1, temperature=0.0)
        cold, warm = [], []
        for number in range(rounds):
            llm = LLM(str(model), dtype="bfloat16", num_blocks=2 * (prefix + suffix) // 16 + 8,
                      max_model_len=2 * prefix)  # fmt: skip
            shared = [(31 * i + number) % 300 + 20 for i in range(prefix)]
            started = time.perf_counter()
            llm.generate([shared], first)
            cold.append(time.perf_counter() - started)
            started = time.perf_counter()
            out = llm.generate([shared + list(range(30, 30 + suffix))], first)[0]
            warm.append(time.perf_counter() - started)
            assert out.num_cached_tokens >= prefix - 16, out.num_cached_tokens
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    return {"prefix": prefix, "suffix": suffix, "cold_s": round(cold_s, 4),
            "warm_s": round(warm_s, 4), "warm_over_cold": round(warm_s / cold_s, 4)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--prefix", type=int, default=8192)
    parser.add_argument("--json", default="results/sliding_window.json")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    report: dict[str, Any] = {"cpu": cpu_model(), "torch": torch.__version__}
    report["kv_bytes_per_sequence"] = kv_bytes([4096, 32768, 131072])
    for row in report["kv_bytes_per_sequence"]:
        print("kv bytes:", row)
    report["decode_attention"] = decode_times([4096, 32768], args.rounds)
    for row in report["decode_attention"]:
        print("decode attention:", row)
    report["ttft"] = ttft(args.prefix, 64, max(1, args.rounds // 2))
    print("ttft:", report["ttft"])
    write_json(args.json, report)


if __name__ == "__main__":
    main()
