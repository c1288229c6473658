"""mooncake: a Mooncake-format trace (``prefixcache.integrations.router.mooncake_trace``)
replayed as real token ids, so the trace the simulator replays also drives an engine, our
server, the router or any OpenAI server.

Every hash id stands for one fixed seeded run of ``block_tokens`` token ids (512, the trace's
own block, unless scaled down to fit a small model's context: lengths scale by
``block_tokens / 512``), so requests sharing leading hash ids share exactly that prefix; a
partly filled last block is padded with the request's own tokens. Arrival times are the
trace's (milliseconds) divided by ``rate_scale``; ``limit`` keeps the first requests.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prefixcache.integrations.bench.bench_request import BenchRequest
from prefixcache.integrations.bench.token_source import TokenRange
from prefixcache.integrations.router.mooncake_trace import (
    MOONCAKE_BLOCK_TOKENS,
    TraceFormatError,
    load_mooncake,
)


@dataclass(frozen=True)
class MooncakeReplay:
    """``limit``: first requests kept (None: all); ``rate_scale``: arrivals this many times
    faster; ``block_tokens``: tokens per trace block (<= 512 shrinks every prompt alike);
    ``output_len``: a cap on the trace's output lengths (None: as traced)."""

    limit: int | None = None
    rate_scale: float = 1.0
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    output_len: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and (not _is_int(self.limit) or self.limit < 1):
            raise ValueError(f"limit must be an int >= 1, got {self.limit!r}")
        if self.output_len is not None and (not _is_int(self.output_len) or self.output_len < 1):
            raise ValueError(f"output_len must be an int >= 1, got {self.output_len!r}")
        if isinstance(self.rate_scale, bool) or not isinstance(self.rate_scale, int | float) \
                or not self.rate_scale > 0:  # fmt: skip
            raise ValueError(f"rate_scale must be a number > 0, got {self.rate_scale!r}")
        if not _is_int(self.block_tokens) or not 1 <= self.block_tokens <= MOONCAKE_BLOCK_TOKENS:
            raise ValueError(f"block_tokens must be an int in [1, {MOONCAKE_BLOCK_TOKENS}], "
                             f"got {self.block_tokens!r}")  # fmt: skip


def load_mooncake_requests(path: Path, seed: int, tokens: TokenRange,
                           replay: MooncakeReplay) -> list[BenchRequest]:  # fmt: skip
    """The trace's requests with token ids; ValueError (TraceFormatError) names a bad line."""
    trace = load_mooncake(path, replay.limit)
    scale = replay.block_tokens / MOONCAKE_BLOCK_TOKENS
    blocks: dict[int, tuple[int, ...]] = {}
    start = trace[0].arrival_s
    requests = []
    for number, record in enumerate(trace):
        pieces = []
        for hash_id in record.blocks.tolist():
            if hash_id not in blocks:
                rng = np.random.default_rng([seed, 7, hash_id])
                blocks[hash_id] = tokens.draw(rng, replay.block_tokens)
            pieces.append(blocks[hash_id])
        shared = len(pieces) * replay.block_tokens
        length = max(round(record.input_length * scale), shared, 1)
        if shared < length:
            pieces.append(tokens.draw(np.random.default_rng([seed, 8, number]), length - shared))
        prompt = tuple(itertools.chain.from_iterable(pieces))
        requests.append(BenchRequest(
            request_id=f"mooncake-{number}", prompt_token_ids=prompt,
            max_tokens=min(max(record.output_length, 1), replay.output_len or 2**31),
            workload="mooncake",
            group=str(record.blocks[0]) if len(record.blocks) else "",
            timestamp=(record.arrival_s - start) / replay.rate_scale,
        ))  # fmt: skip
    return requests


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


__all__ = ["MooncakeReplay", "TraceFormatError", "load_mooncake_requests"]
