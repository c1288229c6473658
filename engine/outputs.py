"""What generate() returns: per prompt, one or more completions, cached tokens and timings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log probability under the model's own distribution (the raw logits'
    log-softmax, before penalties, biases, temperature or a grammar), and the ``top`` tokens'
    ``(token id, log probability)``, likeliest first. ``rank`` (1: the likeliest) where it was
    computed (a prompt token's)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


@dataclass
class CompletionOutput:
    """One sample of a request (``index`` < n); ``logprobs`` one entry per token of
    ``token_ids`` when the request asked for them (``SamplingParams.logprobs``)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass
class RequestMetricsView:
    """Seconds: ``ttft`` arrival -> first token, ``tpot`` mean gap after it, ``e2e`` arrival ->
    finish; ``queue`` arrival -> first scheduled."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    queue: float | None = None


KV_EXHAUSTED = "kv_cache_exhausted"  # the pool could not hold the request (pins since admitted)
INTERNAL_ERROR = "internal_error"  # a step raised on this request; the engine went on serving
ERROR_KINDS = (KV_EXHAUSTED, INTERNAL_ERROR)


@dataclass
class RequestOutput:
    """A request's state; ``text`` / ``token_ids`` / ``finish_reason`` are the first sample's.

    A request the engine could not complete ends finished with ``error`` (what went wrong)
    and ``error_kind`` (``KV_EXHAUSTED`` or ``INTERNAL_ERROR``) set."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    finished: bool = False
    metrics: RequestMetricsView = field(default_factory=RequestMetricsView)
    prompt: str | None = None
    error: str | None = None
    error_kind: str | None = None  # with ``error``: one of ``ERROR_KINDS``

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)
