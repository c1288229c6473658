"""SamplingParams: how one request is decoded, validated when it is built."""

from __future__ import annotations

from dataclasses import dataclass, field

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # the seeds a torch.Generator takes
# Temperatures below this are greedy (vLLM's rule): dividing logits by them would only
# overflow, and the distribution they describe is the argmax to within float precision.
GREEDY_TEMPERATURE_EPS = 1e-5


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

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS


def _check_int(name: str, value: object, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
