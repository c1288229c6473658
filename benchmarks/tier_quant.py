"""Quantized KV tiers on SmolLM2 (a section of ``tiered_cache.py``): for ``kv_tier_dtype`` auto /
fp8 / int8, a real-text document is pushed out of the pool into the host tier before each
question, so every answer is computed over the document's blocks as the tier gave them back;
each answer's greedy tokens are compared with the uncached engine's. Reported per dtype: blocks
the tier holds per GiB, the TTFT of the tier hit, identical answers and the share of answer
tokens before the first difference.

    python benchmarks/tier_quant.py [--questions 10] [--out results/tier_quant.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_report import write_json
from kv_quant import FIXED_TEXT, QUESTIONS

from prefixcache.engine import LLM, SamplingParams

BLOCK = 16
TIER_DTYPES = ("auto", "fp8", "int8")


def prompt_of(question: str) -> str:
    return f"{FIXED_TEXT}\n\nQuestion: {question}\nAnswer:"


def agreement(args: argparse.Namespace) -> dict[str, Any]:
    """Per tier dtype: tier capacity, TTFT of the hit, and answers against uncached ones."""
    answer = SamplingParams(max_tokens=args.answer_tokens, temperature=0.0, ignore_eos=True)
    reference = LLM(enable_prefix_caching=False, num_blocks=256, block_size=BLOCK)
    questions = QUESTIONS[: args.questions]
    prompts = [reference.encode(prompt_of(q)) for q in questions]
    # one at a time, as the tiered engines run them: a batch's rows decode beside each other
    # (another split of the work), which may move a bf16 result by an ulp
    expected = [reference.generate([prompt], answer)[0].token_ids for prompt in prompts]
    document = reference.encode(FIXED_TEXT)
    fillers = [[(7 * i + 131 * q) % 30000 + 100 for i in range(len(document) + 64)]
               for q in range(len(questions))]  # a new one each time: never a hit
    del reference
    results: dict[str, Any] = {}
    for tier_dtype in TIER_DTYPES:
        # a pool for one prompt: the filler pushes the whole document out into the tier
        pool = -(-(len(fillers[0]) + 1) // BLOCK)
        llm = LLM(num_blocks=pool, block_size=BLOCK, kv_host_memory="1GiB",
                  kv_tier_dtype=tier_dtype)  # fmt: skip
        llm.generate([document], SamplingParams(max_tokens=1, temperature=0.0))
        same, prefix_share, ttfts = 0, [], []
        for prompt, want, filler in zip(prompts, expected, fillers, strict=True):
            llm.generate([filler], SamplingParams(max_tokens=1, temperature=0.0))
            assert llm.cache.lookup(document) == 0, "the document stayed in the pool"
            hits = llm.stats()["host_tier_hit_tokens"]
            start = time.perf_counter()
            got = llm.generate([prompt], answer)[0]
            ttfts.append(got.metrics.ttft or time.perf_counter() - start)
            if llm.stats()["host_tier_hit_tokens"] - hits < len(document) - BLOCK:
                raise RuntimeError("the document did not come back from the tier")
            same += got.token_ids == want
            agree = next((i for i, (a, b) in enumerate(zip(got.token_ids, want, strict=True))
                          if a != b), len(want))  # fmt: skip
            prefix_share.append(agree / len(want))
        slots = llm.cache.host_tier.num_slots
        results[tier_dtype] = {
            "tier_blocks_per_gib": slots, "tier_tokens_per_gib": slots * BLOCK,
            "median_ttft_s": statistics.median(ttfts), "identical_answers": same,
            "answers": len(prompts), "mean_share_before_first_difference":
                statistics.mean(prefix_share),
        }  # fmt: skip
        llm.cache.check_invariants()
        del llm
    return {"document_tokens": len(document), "answer_tokens": args.answer_tokens,
            "by_tier_dtype": results}  # fmt: skip


def print_agreement(result: dict[str, Any]) -> None:
    print(f"quantized host tier, a {result['document_tokens']}-token document served from the "
          f"tier, {result['answer_tokens']} greedy tokens against the uncached engine:")
    for name, row in result["by_tier_dtype"].items():
        print(f"  {name:5s} {row['tier_tokens_per_gib']:>9,d} tokens/GiB, TTFT "
              f"{row['median_ttft_s']:.3f} s, identical answers {row['identical_answers']}/"
              f"{row['answers']}, tokens before the first difference "
              f"{row['mean_share_before_first_difference']:.1%}")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--answer-tokens", type=int, default=32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    parser.add_argument("--out", default="results/tier_quant.json")
    args = parser.parse_args()
    result = agreement(args)
    print_agreement(result)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
