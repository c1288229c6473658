"""Model forward speed: prefixcache.engine's decoder vs transformers on the same weights.

For float32 and bfloat16, with torch threads = 2 (default), measured side by side in one run:
1. cold prefill of a 1,637-token prompt (empty KV cache), logits of the last position only;
2. prefill of a 64-token prompt, logits of the last position only;
3. single-token decode after the long prompt (per-token time, KV cache on both sides).
Each time is reported as wall-clock and as process CPU time (`*_cpu`); the first forward of
the long prompt in the process is reported too (`*_first_call_long_ms`).
Ours uses `ContiguousAttention`; transformers uses its default SDPA attention and
`DynamicCache`. Both models hold the SmolLM2-135M-Instruct GGUF weights dequantized to the
same float values. Times are medians over rounds, each round running every case once, in turn.
This isolates the decoder (projections, norms, RoPE, MLP) from the paged attention; the
engine's TTFT against its targets, paged kernels included, is `engine_bench.py`'s job.

    python benchmarks/model_forward.py [--quick] [--threads 2] [--out results/model_forward.json]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_report import write_json
from hf_reference import hf_llama_from_state

from prefixcache.engine.model import CausalLM, ContiguousAttention
from prefixcache.engine.model_registry import resolve_model
from prefixcache.engine.tokenizer import Tokenizer
from prefixcache.engine.weights import GGUFFile, build_model

PROMPT_TEXT = (
    "You are a careful assistant. Use the documents below to answer the question, and cite "
    "the passage you rely on. Document {i}: The prefix cache keeps attention keys and values "
    "of shared prompt prefixes in paged blocks, found again by hashing token blocks. "
)


def prompt_ids(tokenizer: Tokenizer, length: int) -> torch.Tensor:
    text = "".join(PROMPT_TEXT.format(i=i) for i in range(length // 20 + 2))
    ids = tokenizer.encode(text)[:length]
    assert len(ids) == length
    return torch.tensor(ids, dtype=torch.int64)  # [length]


class Cases:
    """Timed callables for one dtype: our model and transformers' on the same weights."""

    def __init__(
        self, ours: CausalLM, hf: Any, long_ids: torch.Tensor, short_ids: torch.Tensor
    ) -> None:
        self.ours, self.hf = ours, hf
        self.long_ids, self.short_ids = long_ids, short_ids
        self.decode_state: dict[str, Any] = {}
        # transformers >= 5.2x renamed `past_key_values` to `cache`.
        parameters = inspect.signature(hf.forward).parameters
        self.cache_kwarg = "cache" if "cache" in parameters else "past_key_values"

    def ours_prefill(self, ids: torch.Tensor) -> torch.Tensor:
        attention = ContiguousAttention(self.ours.config.num_layers)
        hidden = self.ours(ids, torch.arange(ids.numel()), attention)
        return self.ours.compute_logits(hidden[-1:])

    def hf_prefill(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.hf(ids[None], use_cache=False, logits_to_keep=1).logits

    def start_decode(self) -> None:
        """Prefill the long prompt once per side (untimed); decode then continues it."""
        import transformers

        attention = ContiguousAttention(self.ours.config.num_layers)
        self.ours(self.long_ids, torch.arange(self.long_ids.numel()), attention)
        cache = transformers.DynamicCache()
        with torch.inference_mode():
            self.hf(
                self.long_ids[None], **{self.cache_kwarg: cache}, use_cache=True, logits_to_keep=1
            )
        self.decode_state = {
            "ours": attention,
            "hf": cache,
            "pos_ours": self.long_ids.numel(),
            "pos_hf": self.long_ids.numel(),
        }

    def ours_decode(self, steps: int) -> None:
        state = self.decode_state
        for _ in range(steps):
            token = torch.tensor([int(state["pos_ours"]) % 1000 + 100])
            hidden = self.ours(token, torch.tensor([state["pos_ours"]]), state["ours"])
            self.ours.compute_logits(hidden)
            state["pos_ours"] += 1

    def hf_decode(self, steps: int) -> None:
        state = self.decode_state
        for _ in range(steps):
            token = torch.tensor([[int(state["pos_hf"]) % 1000 + 100]])
            with torch.inference_mode():
                self.hf(token, **{self.cache_kwarg: state["hf"]}, use_cache=True, logits_to_keep=1)
            state["pos_hf"] += 1


def interleaved_wall_and_cpu_ms(
    timers: dict[str, Callable[[], Any]], rounds: int
) -> dict[str, float]:
    """Median wall ms (`<name>`) and median process CPU ms (`<name>_cpu`) of each timer,
    every round running each timer once, in turn. CPU time is the steadier figure on a
    shared machine (it leaves out time spent descheduled)."""
    samples: dict[str, list[float]] = {}
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, timed in timers.items():
                wall, cpu = time.perf_counter(), time.process_time()
                timed()
                samples.setdefault(name, []).append((time.perf_counter() - wall) * 1e3)
                samples.setdefault(f"{name}_cpu", []).append((time.process_time() - cpu) * 1e3)
    finally:
        gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def measure(cases: Cases, rounds: int, decode_steps: int) -> dict[str, float]:
    """First-call (cold process) long prefill, then interleaved medians of every case."""
    first = time.perf_counter()
    cases.ours_prefill(cases.long_ids)
    ours_first = time.perf_counter() - first
    first = time.perf_counter()
    cases.hf_prefill(cases.long_ids)
    hf_first = time.perf_counter() - first
    cases.start_decode()
    results = interleaved_wall_and_cpu_ms(
        {
            "ours_prefill_long_ms": lambda: cases.ours_prefill(cases.long_ids),
            "hf_prefill_long_ms": lambda: cases.hf_prefill(cases.long_ids),
            "ours_prefill_short_ms": lambda: cases.ours_prefill(cases.short_ids),
            "hf_prefill_short_ms": lambda: cases.hf_prefill(cases.short_ids),
            "ours_decode_ms": lambda: cases.ours_decode(decode_steps),
            "hf_decode_ms": lambda: cases.hf_decode(decode_steps),
        },
        rounds,
    )
    for name in ("ours_decode_ms", "hf_decode_ms", "ours_decode_ms_cpu", "hf_decode_ms_cpu"):
        results[name] /= decode_steps
    results["ours_first_call_long_ms"] = ours_first * 1e3
    results["hf_first_call_long_ms"] = hf_first * 1e3
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="short prompts, one round")
    parser.add_argument("--out", type=Path, default=Path("results/model_forward.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    long_len, short_len = (128, 16) if args.quick else (1637, 64)
    rounds = args.rounds or (1 if args.quick else 5)
    decode_steps = 2 if args.quick else 16

    resolved = resolve_model(args.model)
    if resolved.kind != "gguf":
        raise SystemExit("this benchmark reads a GGUF model (e.g. the default 'smollm2')")
    gguf_file = GGUFFile(resolved.path)
    config = gguf_file.config
    state = gguf_file.hf_state_dict()
    tokenizer = Tokenizer.from_gguf_metadata(gguf_file.metadata)
    long_ids, short_ids = prompt_ids(tokenizer, long_len), prompt_ids(tokenizer, short_len)

    results: dict[str, Any] = {
        "config": {
            "model": args.model,
            "threads": args.threads,
            "long_prompt_tokens": long_len,
            "short_prompt_tokens": short_len,
            "rounds": rounds,
            "decode_steps": decode_steps,
            "quick": args.quick,
            "torch": torch.__version__,
        }
    }
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        ours = build_model(config, state, dtype)
        hf = hf_llama_from_state(config, {k: v.clone() for k, v in state.items()}, dtype)
        results[name] = measure(Cases(ours, hf, long_ids, short_ids), rounds, decode_steps)
        del ours, hf
    bf16, fp32 = results["bfloat16"], results["float32"]
    results["ratios"] = {
        f"ours_over_hf_{kind}_{dtype}{suffix}": round(
            results[dtype][f"ours_{kind}_ms{suffix}"] / results[dtype][f"hf_{kind}_ms{suffix}"], 3
        )
        for dtype in ("bfloat16", "float32")
        for kind in ("prefill_long", "prefill_short", "decode")
        for suffix in ("", "_cpu")
    }
    results["ratios"]["ours_bf16_prefill_long_over_hf_bf16"] = round(
        bf16["ours_prefill_long_ms"] / bf16["hf_prefill_long_ms"], 3
    )
    results["ratios"]["ours_bf16_over_fp32_prefill_long"] = round(
        bf16["ours_prefill_long_ms"] / fp32["ours_prefill_long_ms"], 3
    )
    results["ratios"]["ours_bf16_over_fp32_decode"] = round(
        bf16["ours_decode_ms"] / fp32["ours_decode_ms"], 3
    )
    results["ratios"]["ours_bf16_prefill_long_over_hf_bf16_cpu"] = round(
        bf16["ours_prefill_long_ms_cpu"] / bf16["hf_prefill_long_ms_cpu"], 3
    )
    report(results)
    write_json(args.out, results)
    return results


def report(results: dict[str, Any]) -> None:
    for dtype in ("bfloat16", "float32"):
        row = results[dtype]
        print(
            f"{dtype:9s} prefill {results['config']['long_prompt_tokens']} tok: "
            f"ours {row['ours_prefill_long_ms']:8.1f} ms  hf {row['hf_prefill_long_ms']:8.1f} ms"
            f" | prefill {results['config']['short_prompt_tokens']} tok: ours "
            f"{row['ours_prefill_short_ms']:6.1f} ms  hf {row['hf_prefill_short_ms']:6.1f} ms"
            f" | decode/token: ours {row['ours_decode_ms']:6.1f} ms  "
            f"hf {row['hf_decode_ms']:6.1f} ms"
        )
    for name, value in results["ratios"].items():
        print(f"  {name:46s} {value:6.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
