"""Sliding-window layers: KV bytes per sequence, the pool a memory budget buys, requests run
together, decode attention time per layer type against the context, and TTFT cold vs warm on a
shared prefix, for Gemma-3-shaped models.

    python benchmarks/sliding_window.py [--json results/sliding_window.json]

1. KV bytes per sequence at 4K / 32K / 128K tokens for Gemma 3 1B's shape (26 layers, 5 local :
   1 global, window 512, 1 KV head of 256, bf16): every layer keeping every block vs the
   hybrid KV cache (sliding layers keep their window), from ``prefixcache.sizing``.
2. The engine's own pools for that attention shape in ``--budget`` bytes (default 2 GiB;
   ``max_num_seqs`` 16, steps of 4,096 tokens): logical blocks, sliding slots, and how many
   32K-token sequences each pool holds, hybrid vs every layer global.
3. Requests run together: 16 requests of 4,000 distinct prompt tokens + 32 generated on a tiny
   Gemma-3-shaped model (window 128, float32) whose pool holds four of them with every layer
   global, the hybrid cache in the same bytes: the most running at once, preemptions, wall
   time, and how many answers are the same tokens in both (the batches differ, so a near
   tie may round either way).
4. Decode attention of one layer at 4K and 32K tokens of context (bf16, 8 sequences, block
   16; best of ``--rounds``, alternated): a sliding layer through the compiled windowed kernel
   and through the float64 torch reference (both read only the window's blocks), a global
   layer (the compiled paged kernel) the whole context; and one sliding layer's cold prefill
   of 1,637 tokens, compiled vs reference.
5. TTFT on a tiny Gemma-3-shaped model (random weights, 6 layers, window 512): an 8K-token
   prompt cold, then the same 8K prefix with 64 new tokens (a prefix hit).
6. The price of windows: SmolLM2's own weights, plain, against the same weights with Gemma
   3's layout (every 6th layer global, the others a 512-token window; fused layers, the
   sliding ones through the compiled windowed kernel): cold TTFT of 1,637 tokens and the time
   a decoded token takes after 1,000 (``--skip-smollm2`` leaves it out).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from bench_report import write_json

from prefixcache.engine import LLM, SamplingParams
from prefixcache.kernels import paged_decode_attention
from prefixcache.kernels.cpu.kernel_choice import cpu_model
from prefixcache.kernels.cpu.windowed_attention import (
    windowed_attention_cpu,
    windowed_attention_supports,
)
from prefixcache.kernels.reference.paged_attention import paged_prefill_attention_reference
from prefixcache.sizing import MODEL_PRESETS

GEMMA3_1B = {"layers": 26, "pattern": 6, "window": 512, "kv_heads": 1, "head_dim": 256}
SEQUENCE = 32768  # the context the pools are compared at


def kv_bytes(contexts: list[int]) -> list[dict[str, Any]]:
    shape = MODEL_PRESETS["gemma3-1b"]
    rows = []
    for context in contexts:
        every = shape.bytes_per_token("bf16") * context
        hybrid = shape.bytes_for_context("bf16", context)
        rows.append({"context": context, "every_layer_mib": round(every / 2**20, 1),
                     "hybrid_mib": round(hybrid / 2**20, 1),
                     "sequences_ratio": round(every / hybrid, 2)})  # fmt: skip
    return rows


def pool_sizes(folder: Path, budget: int) -> dict[str, Any]:
    """The engine's pools for the model at ``folder`` in ``budget`` bytes, hybrid vs global."""
    rows = {}
    for name, hybrid in (("hybrid", True), ("every_layer", False)):
        llm = LLM(str(folder), dtype="bfloat16", kv_cache_memory=budget, block_size=16,
                  max_num_seqs=16, max_model_len=SEQUENCE, hybrid_kv_cache=hybrid)  # fmt: skip
        slots = llm.sliding.num_slots if llm.sliding is not None else None
        rows[name] = {"pool_bytes": llm.kv.nbytes, "logical_blocks": llm.cache.num_blocks,
                      "sliding_slots": slots,
                      "sequences_of_32k": round(llm.cache.num_blocks / (SEQUENCE // 16), 2)}
        del llm
    rows["sequences_ratio"] = round(rows["hybrid"]["logical_blocks"]
                                    / rows["every_layer"]["logical_blocks"], 2)  # fmt: skip
    return rows


def run_together(folder: Path, requests: int, prompt: int, output: int) -> dict[str, Any]:
    """``requests`` distinct prompts at once through a pool that holds four with every layer
    global; the hybrid engine gets the same bytes."""
    params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
    prompts = [[(7 * i + 13 * r) % 300 + 20 for i in range(prompt)] for r in range(requests)]
    budget = None
    rows: dict[str, Any] = {}
    for name, hybrid in (("every_layer", False), ("hybrid", True)):
        options = {"num_blocks": 4 * -(-(prompt + output) // 16)} if budget is None else {
            "kv_cache_memory": budget}  # fmt: skip
        # steps of one prompt (a power of two), so each prompt prefills in one step
        llm = LLM(str(folder), dtype="float32", block_size=16, max_num_seqs=requests,
                  max_num_batched_tokens=1 << prompt.bit_length(), hybrid_kv_cache=hybrid,
                  **options)  # fmt: skip
        budget = budget or llm.kv.nbytes
        ids = [llm._add(np.asarray(p, dtype=np.int32), params, None) for p in prompts]
        most, done = 0, {}
        started = time.perf_counter()
        while llm.engine.has_unfinished():
            for out in llm.engine.step(finished_only=True):
                done[out.request_id] = out.token_ids
            most = max(most, len(llm.engine.scheduler.running))
        rows[name] = {"pool_bytes": llm.kv.nbytes, "most_running": most,
                      "preemptions": llm.stats()["preemptions"],
                      "wall_s": round(time.perf_counter() - started, 2)}  # fmt: skip
        rows[name]["tokens"] = [done[i] for i in ids]
    pairs = zip(rows["hybrid"].pop("tokens"), rows["every_layer"].pop("tokens"), strict=True)
    rows["same_answers"] = f"{sum(a == b for a, b in pairs)}/{requests}"
    rows["running_ratio"] = round(rows["hybrid"]["most_running"]
                                  / rows["every_layer"]["most_running"], 2)  # fmt: skip
    return rows


def decode_times(contexts: list[int], rounds: int) -> list[dict[str, Any]]:
    """One layer's decode: a sliding layer through the compiled windowed kernel and through the
    float64 torch reference, a global layer through the compiled paged kernel."""
    torch.manual_seed(0)
    return [{"context": context, **decode_row(context, rounds)} for context in contexts]


def decode_row(context: int, rounds: int) -> dict[str, float]:
    seqs, heads, kv_heads, dim, block = 8, 4, 1, 256, 16
    window = GEMMA3_1B["window"]
    blocks = seqs * (context // block + 1)
    k_cache = torch.randn(blocks, block, kv_heads, dim, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.arange(blocks, dtype=torch.int32).reshape(seqs, -1)
    lengths = torch.full((seqs,), context, dtype=torch.int32)
    q = torch.randn(seqs, heads, dim, dtype=torch.bfloat16)
    arguments = (q, k_cache, v_cache, tables, lengths, 256**-0.5)
    runs = {
        "global": lambda: paged_decode_attention(*arguments),
        "sliding_reference": lambda: paged_decode_attention(*arguments, sliding_window=window),
    }
    if windowed_attention_supports(q, k_cache):
        seq_of = torch.arange(seqs, dtype=torch.int32)
        positions = lengths.to(torch.int64) - 1
        runs["sliding_compiled"] = lambda: windowed_attention_cpu(
            q, k_cache, v_cache, tables, seq_of, positions, window, 256**-0.5)
    return alternated(runs, rounds)


def prefill_times(tokens: int, rounds: int) -> dict[str, Any]:
    """One sliding layer's cold prefill of ``tokens`` (Gemma 3 1B's heads, bf16): the compiled
    windowed kernel against the float64 torch reference."""
    torch.manual_seed(0)
    heads, kv_heads, dim, block, window = 4, 1, 256, 16, GEMMA3_1B["window"]
    blocks = -(-tokens // block)
    k_cache = torch.randn(blocks, block, kv_heads, dim, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.arange(blocks, dtype=torch.int32)[None]
    q = torch.randn(tokens, heads, dim, dtype=torch.bfloat16)
    keys = k_cache.reshape(-1, kv_heads, dim)[:tokens]
    values = v_cache.reshape(-1, kv_heads, dim)[:tokens]
    starts = torch.tensor([0, tokens], dtype=torch.int32)
    runs = {"sliding_reference": lambda: paged_prefill_attention_reference(
        q, keys, values, k_cache, v_cache, tables, starts, torch.zeros(1, dtype=torch.int32),
        256**-0.5, sliding_window=window)}  # fmt: skip
    if windowed_attention_supports(q, k_cache):
        runs["sliding_compiled"] = lambda: windowed_attention_cpu(
            q, k_cache, v_cache, tables, torch.zeros(tokens, dtype=torch.int32),
            torch.arange(tokens), window, 256**-0.5)
    return {"tokens": tokens, **alternated(runs, rounds)}


def alternated(runs: dict[str, Any], rounds: int) -> dict[str, float]:
    """Best milliseconds of each callable: one untimed pass of each, then A B A B."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for warm_up in (True, False):
        for _ in range(1 if warm_up else rounds):
            for name, run in runs.items():
                started = time.perf_counter()
                run()
                if not warm_up:
                    times[name].append(time.perf_counter() - started)
    return {f"{name}_ms": round(min(t) * 1e3, 3) for name, t in times.items()}


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


def windows_on_smollm2(rounds: int) -> dict[str, Any]:
    """Part 6: the default model as a bf16 HF folder, and a copy whose config.json gives 25
    of its 30 layers a 512-token window."""
    import json
    import shutil

    from peer_model import export_hf_folder

    plain = export_hf_folder(Path("results/smollm2-hf"))
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        windowed = Path(folder) / "smollm2-windowed"
        shutil.copytree(plain, windowed)
        config = json.loads((windowed / "config.json").read_text())
        layers = config["num_hidden_layers"]
        config["sliding_window"] = 512
        config["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                 for i in range(layers)]  # fmt: skip
        (windowed / "config.json").write_text(json.dumps(config))
        for name, path in (("plain", plain), ("windows_5_of_6", windowed)):
            llm = LLM(str(path), dtype="bfloat16", num_blocks=1024)
            cold = []
            for number in range(rounds):
                prompt = [(31 * i + 7 * number) % 40000 + 100 for i in range(1637)]
                started = time.perf_counter()
                llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
                cold.append(time.perf_counter() - started)
            long = [(17 * i) % 40000 + 100 for i in range(1000)]
            out = llm.generate([long], SamplingParams(max_tokens=32, temperature=0.0,
                                                      ignore_eos=True))[0]  # fmt: skip
            rows[name] = {"cold_1637_s": round(min(cold), 3),
                          "decode_ms_per_token": round(out.metrics.tpot * 1e3, 2)}  # fmt: skip
            del llm
    rows["cold_ratio"] = round(rows["windows_5_of_6"]["cold_1637_s"]
                               / rows["plain"]["cold_1637_s"], 2)  # fmt: skip
    rows["decode_ratio"] = round(rows["windows_5_of_6"]["decode_ms_per_token"]
                                 / rows["plain"]["decode_ms_per_token"], 2)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--prefix", type=int, default=8192)
    parser.add_argument("--budget", type=int, default=2 << 30, help="pool bytes for part 2")
    parser.add_argument("--requests", type=int, default=16, help="part 3's requests")
    parser.add_argument("--prompt", type=int, default=4000, help="part 3's prompt tokens")
    parser.add_argument("--skip-smollm2", action="store_true", help="leave part 6 out")
    parser.add_argument("--json", default="results/sliding_window.json")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    report: dict[str, Any] = {"cpu": cpu_model(), "torch": torch.__version__}
    report["kv_bytes_per_sequence"] = kv_bytes([4096, 32768, 131072])
    for row in report["kv_bytes_per_sequence"]:
        print("kv bytes:", row)
    from tiny_model_factory import make_tiny_model_dir

    with tempfile.TemporaryDirectory() as folder:
        shape = make_tiny_model_dir(  # Gemma 3 1B's attention (what sizes the KV), tiny MLPs
            Path(folder) / "g1b", "gemma3", hidden_size=64, intermediate_size=64,
            num_hidden_layers=GEMMA3_1B["layers"], num_attention_heads=4,
            num_key_value_heads=GEMMA3_1B["kv_heads"], head_dim=GEMMA3_1B["head_dim"],
            sliding_window=GEMMA3_1B["window"], max_position_embeddings=SEQUENCE,
        )  # fmt: skip
        report["pool"] = pool_sizes(shape, args.budget)
        print("pool:", report["pool"])
        small = make_tiny_model_dir(
            Path(folder) / "small", "gemma3", hidden_size=64, intermediate_size=128,
            num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
            sliding_window=128, max_position_embeddings=8192,
        )  # fmt: skip
        report["run_together"] = run_together(small, args.requests, args.prompt, 32)
        print("run together:", report["run_together"])
    report["decode_attention"] = decode_times([4096, 32768], args.rounds)
    for row in report["decode_attention"]:
        print("decode attention:", row)
    report["prefill_attention"] = prefill_times(1637, max(1, args.rounds // 3))
    print("prefill attention:", report["prefill_attention"])
    report["ttft"] = ttft(args.prefix, 64, max(1, args.rounds // 2))
    print("ttft:", report["ttft"])
    if not args.skip_smollm2:
        report["windows_on_smollm2"] = windows_on_smollm2(max(1, args.rounds // 4))
        print("windows on SmolLM2:", report["windows_on_smollm2"])
    write_json(args.json, report)


if __name__ == "__main__":
    main()
