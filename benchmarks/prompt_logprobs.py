"""What a prompt's log probabilities cost: ``LLM.prompt_logprobs`` (recomputed from the
prompt) against a cold prefill and a cached one of the same prompt, on the default model.

    python benchmarks/prompt_logprobs.py [--tokens 1024 --rounds 3 --out FILE.json]

Each round uses a fresh prompt; medians.
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

from prefixcache.engine import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="results/prompt_logprobs.json")
    args = parser.parse_args()
    llm = LLM()
    first = SamplingParams(max_tokens=1, temperature=0.0)
    times: dict[str, list[float]] = {"cold_prefill": [], "cached_prefill": [],
                                     "prompt_logprobs_top0": [], "prompt_logprobs_top5": []}
    for number in range(args.rounds):
        prompt = [(13 * i + 7 * number) % 40000 + 100 for i in range(args.tokens)]
        for name, call in (("cold_prefill", lambda p=prompt: llm.generate([p], first)),
                           ("cached_prefill", lambda p=prompt: llm.generate([p], first)),
                           ("prompt_logprobs_top0", lambda p=prompt: llm.prompt_logprobs(p, 0)),
                           ("prompt_logprobs_top5", lambda p=prompt: llm.prompt_logprobs(p, 5))):
            started = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - started)
    medians = {name: round(statistics.median(t), 4) for name, t in times.items()}
    report: dict[str, Any] = {"tokens": args.tokens, "rounds": args.rounds, "seconds": medians,
                              "top0_over_cold_prefill": round(
                                  medians["prompt_logprobs_top0"] / medians["cold_prefill"], 3)}
    print(report)
    write_json(args.out, report)


if __name__ == "__main__":
    main()
