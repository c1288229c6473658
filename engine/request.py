"""One sequence inside the engine: its tokens, its blocks, its progress and its timings."""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefixcache.engine.outputs import TokenLogprob
from prefixcache.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"  # waiting, its prefix being read from a lower KV tier
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Wall-clock timestamps (time.perf_counter seconds) and the figures derived from them."""

    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token: arrival to the first sampled token."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    def tpot(self, num_output_tokens: int) -> float | None:
        """Mean time per output token after the first."""
        if self.first_token_time is None or self.last_token_time is None or num_output_tokens < 2:
            return None
        return (self.last_token_time - self.first_token_time) / (num_output_tokens - 1)


class Request:
    """A sequence being generated. ``tokens`` holds prompt + output ids (``num_tokens`` valid).

    ``num_computed_tokens`` tokens have their KV in ``block_ids``; the last sampled token is
    computed in the next step. ``num_committed_blocks`` full blocks were offered to the cache.
    ``num_written_tokens`` of them are known written: a request admitted on a partial-block
    hit counts its copied tokens as computed before the step that copies them has run.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | np.ndarray,
        params: SamplingParams,
        salt: str | None = None,
        arrival_time: float | None = None,
        sample_index: int = 0,
    ) -> None:
        self.request_id = request_id
        self.params = params
        self.salt = salt
        self.sample_index = sample_index
        self.num_prompt_tokens = len(prompt_token_ids)
        self.tokens = np.zeros(self.num_prompt_tokens + params.max_tokens, dtype=np.int32)
        self.tokens[: self.num_prompt_tokens] = prompt_token_ids
        self.num_tokens = self.num_prompt_tokens
        self.block_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_written_tokens = 0
        self.num_committed_blocks = 0
        self.num_cached_tokens: int | None = None
        self.num_preemptions = 0
        # Lower-tier read ahead of admission (``Scheduler``): None until looked up, then the
        # payloads read (chain hash -> payload; emptied once admitted); ``tier_fetch`` while
        # the read runs.
        self.tier_payloads: dict[int, Any] | None = None
        self.tier_fetch: Future[dict[int, Any]] | None = None
        # the structured output's llguidance matcher (``StructuredOutput``), set by the engine
        self.matcher: Any = None
        self.logprobs: list[TokenLogprob] = []  # one per output token (params.logprobs)
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.metrics = RequestMetrics()
        if arrival_time is not None:
            self.metrics.arrival_time = arrival_time

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.tokens[: self.num_prompt_tokens].tolist()

    @property
    def output_token_ids(self) -> list[int]:
        return self.tokens[self.num_prompt_tokens : self.num_tokens].tolist()

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def all_tokens(self) -> np.ndarray:  # [num_tokens] int32 view
        return self.tokens[: self.num_tokens]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.tokens[self.num_tokens] = token_id
        self.num_tokens += 1

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_ids)})"
        )
