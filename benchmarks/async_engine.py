"""AsyncLLM decode speed by where the model was loaded: on the engine's own thread
(``AsyncLLM(model=...)``) or on the caller's thread (``AsyncLLM(LLM(...))``).

Loading runs torch work, which gives the loading thread its own OpenMP thread pool; the engine
thread then makes a second one. Each variant runs in a fresh process (a pool cannot be undone),
the two alternating for ``--rounds`` rounds: one sequence, a 440-token prompt, 32 new tokens
streamed, decode time per token from the engine's metrics, median over the requests.

    python benchmarks/async_engine.py [--rounds 2] [--out results/async_engine.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench_report import write_json

VARIANTS = ("engine_thread", "caller_thread")
REQUESTS = 4


def measure(variant: str) -> list[float]:
    """Decode seconds per token of REQUESTS streamed requests, in this process."""
    sys.path.insert(0, str(Path(__file__).parent))
    from engine_bench import text_tokens

    from prefixcache.engine import LLM, SamplingParams
    from prefixcache.engine.async_llm import AsyncLLM

    engine = AsyncLLM(model="smollm2") if variant == "engine_thread" else AsyncLLM(LLM())
    prompt = text_tokens(engine.llm, 440, 1)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)

    async def one() -> float:
        outputs = [out async for out in engine.generate(prompt, params)]
        return outputs[-1].metrics.tpot

    try:
        return [asyncio.run(one()) for _ in range(REQUESTS)]
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/async_engine.json"))
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    samples: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            done = subprocess.run(
                [sys.executable, __file__, "--child", variant],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            samples[variant] += json.loads(done.stdout.strip().splitlines()[-1])
    report = {variant: statistics.median(values) for variant, values in samples.items()}
    report["caller_over_engine_thread"] = report["caller_thread"] / report["engine_thread"]
    print(
        f"decode per token: model loaded on the engine thread {report['engine_thread'] * 1e3:.1f}"
        f" ms, on the caller's thread {report['caller_thread'] * 1e3:.1f} ms, ratio "
        f"{report['caller_over_engine_thread']:.2f}"
    )
    write_json(args.out, {"requests": samples, **report})


if __name__ == "__main__":
    main()
