"""SamplingParams: how one request is decoded, validated when it is built."""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixcache.engine.structured_output import StructuredOutput

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # the seeds a torch.Generator takes
# Temperatures below this are greedy (vLLM's rule): dividing logits by them would only
# overflow, and the distribution they describe is the argmax to within float precision.
GREEDY_TEMPERATURE_EPS = 1e-5
MAX_REPETITION_PENALTY = 10.0  # far past any useful value; bounds what a client can send
MAX_LOGPROBS = 20  # top tokens a request may ask for (OpenAI's limit for chat)


@dataclass
class SamplingParams:
    """Per-request decoding settings (the names vLLM and the OpenAI API use).

    ``temperature == 0`` is greedy, and so is any temperature below
    ``GREEDY_TEMPERATURE_EPS`` (1e-5): it is set to 0 when the params are built.
    ``top_k == -1`` / ``top_p == 1`` disable those filters.
    ``seed`` (in [-2**63, 2**64 - 1]) makes sampling reproducible per request; sample ``i`` of
    ``n`` draws from ``seed + i`` (modulo 2**64, as torch reads a negative seed). ``stop``
    strings and ``stop_token_ids`` end generation (a stop string is cut from the text unless
    ``include_stop_str_in_output``).
    ``n`` samples share the prompt's KV blocks by reference count (copy-on-write).

    Logit processing, as OpenAI and vLLM define it (``logits_processors``): ``logit_bias``
    adds a value in [-100, 100] to a token's logit; ``min_tokens`` keeps EOS and the stop
    token ids from being sampled (and stop strings from matching) until that many tokens
    are out; ``repetition_penalty`` (> 0, 1: off) divides a positive logit, multiplies a
    negative one, of every token seen in the prompt or the output; ``frequency_penalty`` and
    ``presence_penalty`` (in [-2, 2]) subtract that much per occurrence of a token in the
    output, and once for its presence; ``min_p`` (in [0, 1]) drops, after temperature, the
    tokens less likely than ``min_p`` times the likeliest. A greedy request with any of them
    takes the argmax of the processed logits.

    ``structured`` constrains the output to a JSON Schema, a regex, a choice or a grammar
    (``StructuredOutput``): tokens the grammar does not allow next are masked before sampling,
    and the request stops once the grammar is complete.

    ``logprobs`` (0 to 20) reports each sampled token's log probability and that many top
    alternatives (``TokenLogprob``), from the model's raw distribution (vLLM's default).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    min_p: float = 0.0
    structured: StructuredOutput | None = None
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check_int("max_tokens", self.max_tokens, minimum=1)
        _check_int("n", self.n, minimum=1)
        _check_int("top_k", self.top_k, minimum=-1)
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (disabled) or >= 1, got 0")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise TypeError(f"temperature must be a number, got {type(self.temperature).__name__}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if self.temperature < GREEDY_TEMPERATURE_EPS:
            self.temperature = 0.0
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)):
            raise TypeError(f"top_p must be a number, got {type(self.top_p).__name__}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=None)
            if not SEED_MIN <= self.seed <= SEED_MAX:
                raise ValueError(f"seed must be in [-2**63, 2**64 - 1], got {self.seed}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise TypeError("stop must be a string or a list of non-empty strings")
        for token in self.stop_token_ids:
            _check_int("stop_token_ids entry", token, minimum=0)
        _check_number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_number("repetition_penalty", self.repetition_penalty, 0.0, MAX_REPETITION_PENALTY,
                      open_low=True)
        _check_number("min_p", self.min_p, 0.0, 1.0)
        _check_int("min_tokens", self.min_tokens, minimum=0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens "
                             f"({self.max_tokens})")
        if not isinstance(self.logit_bias, dict):
            raise TypeError(f"logit_bias must be a dict of token id -> bias, got "
                            f"{type(self.logit_bias).__name__}")
        for token, bias in self.logit_bias.items():
            _check_int("logit_bias key", token, minimum=0)
            _check_number(f"logit_bias[{token}]", bias, -100.0, 100.0)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, minimum=0)
            if self.logprobs > MAX_LOGPROBS:
                raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise TypeError(f"structured must be a StructuredOutput, got "
                            f"{type(self.structured).__name__}")  # fmt: skip

    @property
    def modifies_logits(self) -> bool:
        """Whether a logit processor, ``min_p`` or a structured output applies (the engine
        then computes this request's full logits, even when it is greedy)."""
        return bool(self.logit_bias or self.min_tokens or self.presence_penalty
                    or self.frequency_penalty or self.repetition_penalty != 1.0 or self.min_p
                    or self.structured is not None)

    @property
    def needs_logits(self) -> bool:
        """Whether this request's rows need their full logits handed out (for processing or
        for log probabilities)."""
        return self.modifies_logits or self.logprobs is not None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS


def _check_number(name: str, value: object, low: float, high: float,
                  open_low: bool = False) -> None:
    """TypeError unless ``value`` is an int or float (not a bool), ValueError unless it lies
    in [low, high] ((low, high] with ``open_low``; NaN never does)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    inside = (low < value if open_low else low <= value) and value <= high
    if not inside:
        interval = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
        raise ValueError(f"{name} must be in {interval}, got {value}")


def _check_int(name: str, value: object, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
