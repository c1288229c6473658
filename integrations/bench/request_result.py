"""What one request measured: client-side timestamps (time.perf_counter seconds) and counts."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass
class RequestResult:
    """Filled in by a target while the request streams.

    ``start``: just before the request was handed to the target; ``token_times``: arrival of
    every streamed chunk that carried output (the first one is the first token); ``end``: the
    stream closed. ``cached_tokens`` is None when the target does not report it.
    ``engine_ttft``: the engine's own TTFT (embedded targets only), to cross-check ``ttft``.
    """

    request_id: str
    workload: str
    group: str
    prompt_tokens: int
    max_tokens: int
    start: float = 0.0
    end: float | None = None
    token_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    cached_tokens: int | None = None
    engine_ttft: float | None = None
    error: str | None = None

    @property
    def success(self) -> bool:
        return self.error is None and self.end is not None and bool(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def e2el(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None for one-token outputs)."""
        if not self.success or self.output_tokens < 2:
            return None
        assert self.end is not None
        return (self.end - self.token_times[0]) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive streamed chunks."""
        times = self.token_times
        return [later - earlier for earlier, later in itertools.pairwise(times)]
