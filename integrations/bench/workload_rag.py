"""rag: a system prompt, then retrieved document chunks (Zipf-popular, order varies), then a
question. Popular chunks recur, but only a shared *leading* run of chunks is a prefix hit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixcache.integrations.bench.bench_request import BenchRequest
from prefixcache.integrations.bench.token_source import TokenRange, check_positive


@dataclass(frozen=True)
class RagConfig:
    """``num_queries`` prompts of system_len + chunks_per_query * chunk_len + question_len
    tokens; chunks are drawn without replacement from ``num_documents`` with probability
    proportional to 1 / rank ** zipf_exponent. ``shuffle_chunks`` varies the retrieval order
    (otherwise chunks are sorted by popularity rank, the cache-friendly order)."""

    num_queries: int = 6
    num_documents: int = 8
    chunks_per_query: int = 2
    chunk_len: int = 192
    system_len: int = 64
    question_len: int = 32
    output_len: int = 8
    zipf_exponent: float = 1.2
    shuffle_chunks: bool = True

    def __post_init__(self) -> None:
        check_positive(
            num_queries=self.num_queries,
            num_documents=self.num_documents,
            chunks_per_query=self.chunks_per_query,
            chunk_len=self.chunk_len,
            system_len=self.system_len,
            question_len=self.question_len,
            output_len=self.output_len,
        )
        if self.chunks_per_query > self.num_documents:
            raise ValueError(
                f"chunks_per_query ({self.chunks_per_query}) exceeds num_documents "
                f"({self.num_documents})"
            )
        if not self.zipf_exponent >= 0:
            raise ValueError(f"zipf_exponent must be >= 0, got {self.zipf_exponent}")

    @property
    def prompt_len(self) -> int:
        return self.system_len + self.chunks_per_query * self.chunk_len + self.question_len


def zipf_weights(count: int, exponent: float) -> np.ndarray:
    """Normalised probabilities of ranks 1..count under Zipf(exponent); shape [count]."""
    weights = 1.0 / np.arange(1, count + 1, dtype=np.float64) ** exponent
    return weights / weights.sum()


def build_rag(config: RagConfig, seed: int, tokens: TokenRange) -> list[BenchRequest]:
    rng = np.random.default_rng([seed, 2])
    system = tokens.draw(rng, config.system_len)
    documents = [tokens.draw(rng, config.chunk_len) for _ in range(config.num_documents)]
    weights = zipf_weights(config.num_documents, config.zipf_exponent)
    requests = []
    for index in range(config.num_queries):
        picked = rng.choice(config.num_documents, config.chunks_per_query, replace=False, p=weights)
        order = rng.permutation(picked) if config.shuffle_chunks else np.sort(picked)
        prompt = system
        for document in order:
            prompt = prompt + documents[int(document)]
        prompt = prompt + tokens.draw(rng, config.question_len)
        requests.append(
            BenchRequest(
                f"rag-{index}",
                prompt,
                config.output_len,
                "rag",
                group="docs-" + "-".join(str(int(d)) for d in order),
            )
        )
    return requests
