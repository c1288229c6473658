"""RAG middleware benchmark: prefix-cache hit rate and TTFT with and without the middleware.

Workload: a corpus of chunks grouped in topics; each query retrieves its topic's chunks (now
and then one chunk swapped for a neighbour's) in an order that varies from query to query, as
a similarity ranking does. Two engines on the same model serve the same queries side by side,
interleaved query by query so machine noise hits both alike:

* ``baseline``: chunks pasted in the retriever's order (the usual RAG prompt);
* ``middleware``: ``RagMiddleware`` (canonical chunk format and order, cache-aware ordering),
  after ``warm_documents`` on the corpus.

Prints per-arm hit rate (cached prompt tokens / prompt tokens) and mean / median TTFT, and the
ratios; writes JSON to ``results/rag_middleware.json``.

    python benchmarks/rag_middleware.py --model smollm2 --queries 24
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench_report import write_json

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.integrations.sdk import LocalClient, RagMiddleware, RagPromptBuilder
from prefixcache.integrations.sdk.rag import RetrievedChunk

WORDS = (
    "cache", "block", "prefix", "token", "model", "memory", "tenant", "agent", "query",
    "vector", "index", "paged", "kernel", "latency", "request", "batch", "decode", "prefill",
    "radix", "tree", "hash", "eviction", "policy", "pin", "schedule", "document", "answer",
    "context", "window", "attention", "head", "layer", "weight",
)
SYSTEM = "You answer questions using only the context documents. Cite document ids."
GREEDY_ONE = SamplingParams(max_tokens=1, temperature=0.0)


@dataclass
class ArmResult:
    """One arm's figures over the workload."""

    queries: int
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float
    ttft_mean_s: float
    ttft_median_s: float


def make_corpus(topics: int, chunks_per_topic: int, words_per_chunk: int,
                seed: int) -> list[list[RetrievedChunk]]:
    """``topics`` lists of chunks with deterministic pseudo-text."""
    rng = random.Random(seed)
    return [[RetrievedChunk(f"t{t}-c{c}",
                            " ".join(rng.choice(WORDS) for _ in range(words_per_chunk)) + ".")
             for c in range(chunks_per_topic)] for t in range(topics)]


def make_queries(corpus: list[list[RetrievedChunk]], count: int, swap_probability: float,
                 seed: int) -> list[tuple[str, list[RetrievedChunk]]]:
    """(question, retrieved chunks in retriever order) per query."""
    rng = random.Random(seed)
    queries = []
    for i in range(count):
        topic = rng.randrange(len(corpus))
        chunks = list(corpus[topic])
        if rng.random() < swap_probability:  # a neighbouring topic's chunk ranks in
            neighbour = corpus[(topic + 1) % len(corpus)]
            chunks[rng.randrange(len(chunks))] = rng.choice(neighbour)
        rng.shuffle(chunks)
        queries.append((f"Question {i}: what does the context say about {rng.choice(WORDS)}?",
                        chunks))
    return queries


def ttft_of(llm: LLM, messages: list[dict[str, str]]) -> tuple[float, int, int]:
    """(TTFT seconds, prompt tokens, cached tokens) of one request."""
    output = llm.generate([llm.render_chat(messages)], GREEDY_ONE)[0]
    assert output.metrics.ttft is not None
    return output.metrics.ttft, output.num_prompt_tokens, output.num_cached_tokens


def summarize(samples: list[tuple[float, int, int]]) -> ArmResult:
    ttfts = [s[0] for s in samples]
    prompt, cached = sum(s[1] for s in samples), sum(s[2] for s in samples)
    return ArmResult(len(samples), prompt, cached, cached / prompt if prompt else 0.0,
                     statistics.fmean(ttfts), statistics.median(ttfts))


def run(model: str, queries: int = 24, topics: int = 3, chunks_per_topic: int = 4,
        words_per_chunk: int = 60, swap_probability: float = 0.3, num_blocks: int | None = None,
        block_size: int = 16, dtype: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Run both arms side by side; returns the report (also what the JSON holds)."""
    def new_llm() -> LLM:
        return LLM(model, num_blocks=num_blocks, block_size=block_size, dtype=dtype)

    baseline_llm, middleware_llm = new_llm(), new_llm()
    builder = RagPromptBuilder(SYSTEM)
    baseline = RagMiddleware(LocalClient(baseline_llm), builder, canonical=False)
    middleware = RagMiddleware(LocalClient(middleware_llm), builder)
    corpus = make_corpus(topics, chunks_per_topic, words_per_chunk, seed)
    workload = make_queries(corpus, queries, swap_probability, seed + 1)
    warm_start = time.perf_counter()
    middleware.warm_documents([chunk for topic in corpus for chunk in topic])
    warm_seconds = time.perf_counter() - warm_start
    samples: dict[str, list[tuple[float, int, int]]] = {"baseline": [], "middleware": []}
    for question, chunks in workload:
        samples["baseline"].append(ttft_of(baseline_llm, baseline.messages(question, chunks)))
        samples["middleware"].append(ttft_of(middleware_llm,
                                             middleware.messages(question, chunks)))
    for llm in (baseline_llm, middleware_llm):
        llm.cache.check_invariants()
        assert llm.stats()["in_use"] == 0
    arms = {name: summarize(values) for name, values in samples.items()}
    base, mid = arms["baseline"], arms["middleware"]
    return {
        "model": model,
        "workload": {"queries": queries, "topics": topics, "chunks_per_topic": chunks_per_topic,
                     "words_per_chunk": words_per_chunk, "swap_probability": swap_probability,
                     "block_size": block_size, "seed": seed},
        "warm_documents_seconds": warm_seconds,
        "arms": {name: asdict(arm) for name, arm in arms.items()},
        "ratios": {
            "hit_rate_middleware_minus_baseline": mid.hit_rate - base.hit_rate,
            "ttft_mean_baseline_over_middleware": base.ttft_mean_s / mid.ttft_mean_s,
            "ttft_median_baseline_over_middleware": base.ttft_median_s / mid.ttft_median_s,
        },
    }


def print_report(report: dict[str, Any]) -> None:
    print(f"model {report['model']}, {report['workload']['queries']} queries")
    print(f"{'arm':<11} {'hit rate':>9} {'prompt tok':>11} {'cached tok':>11} "
          f"{'TTFT mean ms':>13} {'TTFT median ms':>15}")
    for name, arm in report["arms"].items():
        print(f"{name:<11} {arm['hit_rate']:>9.3f} {arm['prompt_tokens']:>11} "
              f"{arm['cached_tokens']:>11} {arm['ttft_mean_s'] * 1e3:>13.1f} "
              f"{arm['ttft_median_s'] * 1e3:>15.1f}")
    ratios = report["ratios"]
    print(f"TTFT baseline/middleware: mean x{ratios['ttft_mean_baseline_over_middleware']:.2f}, "
          f"median x{ratios['ttft_median_baseline_over_middleware']:.2f}; hit rate "
          f"+{ratios['hit_rate_middleware_minus_baseline']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--queries", type=int, default=24)
    parser.add_argument("--topics", type=int, default=3)
    parser.add_argument("--chunks-per-topic", type=int, default=4)
    parser.add_argument("--words-per-chunk", type=int, default=60)
    parser.add_argument("--num-blocks", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/rag_middleware.json"))
    args = parser.parse_args()
    report = run(args.model, args.queries, args.topics, args.chunks_per_topic,
                 args.words_per_chunk, num_blocks=args.num_blocks, block_size=args.block_size,
                 dtype=args.dtype, seed=args.seed)
    print_report(report)
    write_json(args.out, report)


if __name__ == "__main__":
    main()
