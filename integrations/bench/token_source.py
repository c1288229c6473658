"""Seeded random token ids for synthetic prompts (exact lengths, no tokenizer round trip)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_VOCAB_SIZE = 32000  # safe for most models when the target's vocabulary is unknown


@dataclass(frozen=True)
class TokenRange:
    """Draw ids from ``[low, high)``; ``low`` skips the special and control tokens that most
    vocabularies put first."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 0 <= self.low < self.high:
            raise ValueError(f"bad token range [{self.low}, {self.high})")

    @classmethod
    def for_vocab(cls, vocab_size: int) -> TokenRange:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
        return cls(min(1000, vocab_size // 4), vocab_size)

    def draw(self, rng: np.random.Generator, count: int) -> tuple[int, ...]:
        """``count`` ids; ValueError for a negative count."""
        if count < 0:
            raise ValueError(f"token count must be >= 0, got {count}")
        return tuple(int(t) for t in rng.integers(self.low, self.high, size=count))


def check_positive(**values: int) -> None:
    """ValueError naming the first field that is not a positive int."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_non_negative(**values: int) -> None:
    """ValueError naming the first field that is not an int >= 0."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
