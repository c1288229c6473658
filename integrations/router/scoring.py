"""The routing decision: one function of (prompt, what each backend holds, each backend's load).

The HTTP router, the Ray Serve request router and the trace simulator all call
``RoutingPolicy.choose`` with the same arrays, so a policy proven on a trace is the policy
that routes real traffic.

``cache_aware`` picks the backend with the lowest *estimated time to first token*:
``backlog_s[b] + (prompt_tokens - cached_tokens[b]) * prefill_s_per_token``. A cached prefix is
worth exactly the prefill it saves, and a queue costs exactly its wait, so the policy follows
the cache until a backend's queue outweighs what its cache saves, then balances load, without
a hand-set imbalance threshold. Ties (no backend holds anything, all idle) go to the backend
the request's affinity key hashes to (rendezvous hashing), so new prefixes spread evenly and
the same prefix lands on the same backend again. Estimates within ``tie_fraction`` of the
prompt's whole prefill count as ties.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

ROUTING_POLICIES = ("cache_aware", "round_robin", "least_load", "random", "session_hash")

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class CostModel:
    """Seconds of replica time per uncached prompt token and per generated token (a batched
    decode's share of a step), the numbers behind estimated TTFT and simulated busy time."""

    prefill_s_per_token: float = 5e-5
    decode_s_per_token: float = 5e-4

    def __post_init__(self) -> None:
        for name in ("prefill_s_per_token", "decode_s_per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def rendezvous_order(key: int, num_backends: int) -> np.ndarray:  # [num_backends] uint64
    """Highest-random-weight scores of ``key`` on backends 0..n-1: argmax is the key's home, and
    removing a backend moves only the keys it was home to."""
    with np.errstate(over="ignore"):
        x = np.arange(1, num_backends + 1, dtype=np.uint64) * _GOLDEN + np.uint64(key % 2**64)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


class RoutingPolicy:
    """Chooses a backend index for each request; see the module docstring for ``cache_aware``.

    ``round_robin`` cycles, ``least_load`` takes the smallest backlog (ties drawn at random),
    ``random`` draws (seeded),
    ``session_hash`` sends each affinity key to its rendezvous home whatever the load.
    ``sticky_slack_s``: a session's previous backend is kept while its estimated TTFT is within
    this many seconds of the best one. ``tie_fraction``: estimates within this share of the
    prompt's whole prefill of the best are ties, so a match on a shared template header (a
    few tokens) does not pull every new prefix onto one backend. ``load_weight`` scales the
    backlog against the prefill saved (1: both are seconds).
    """

    def __init__(
        self, name: str, cost: CostModel | None = None, seed: int = 0, sticky_slack_s: float = 0.5,
        load_weight: float = 1.0, tie_fraction: float = 0.1,
    ) -> None:
        if name not in ROUTING_POLICIES:
            raise ValueError(f"unknown routing policy {name!r}; choose from {ROUTING_POLICIES}")
        self.name = name
        self.cost = cost or CostModel()
        self.sticky_slack_s = sticky_slack_s
        self.load_weight = load_weight
        self.tie_fraction = tie_fraction
        self._next = 0
        self._rng = random.Random(seed)

    @property
    def uses_cache(self) -> bool:
        """Whether ``choose`` reads ``cached_tokens`` (the caller may skip the index lookup)."""
        return self.name == "cache_aware"

    def choose(
        self,
        prompt_tokens: int,
        cached_tokens: np.ndarray,  # [num_backends] tokens of the prompt each backend holds
        backlog_s: np.ndarray,  # [num_backends] seconds of work queued ahead
        affinity_key: int,
        healthy: np.ndarray | None = None,  # [num_backends] bool; None: all
        sticky: int | None = None,
    ) -> int:
        """The index of the chosen backend. Raises ValueError when no backend is healthy."""
        n = len(backlog_s)
        ok = np.ones(n, dtype=bool) if healthy is None else np.asarray(healthy, dtype=bool)
        if n == 0 or not ok.any():
            raise ValueError("no healthy backend to route to")
        if self.name == "round_robin":
            return self._round_robin(ok)
        if self.name == "random":
            return self._rng.choice(np.flatnonzero(ok).tolist())
        home = rendezvous_order(affinity_key, n)
        if self.name == "session_hash":
            return int(np.argmax(np.where(ok, home, 0)))
        if self.name == "least_load":
            score = np.where(ok, np.asarray(backlog_s, dtype=np.float64), np.inf)
            tied = np.flatnonzero(score <= float(score.min()) + 1e-9)
            return int(tied[0]) if len(tied) == 1 else self._rng.choice(tied.tolist())
        score = self.estimated_ttft_s(prompt_tokens, cached_tokens, backlog_s)
        score = np.where(ok, score, np.inf)
        best = float(score.min())
        if sticky is not None and 0 <= sticky < n and score[sticky] <= best + self.sticky_slack_s:
            return int(sticky)
        window = self.tie_fraction * prompt_tokens * self.cost.prefill_s_per_token
        tied = score <= best + window + 1e-9
        return int(np.argmax(np.where(tied, home, 0)))

    def estimated_ttft_s(
        self, prompt_tokens: int, cached_tokens: np.ndarray, backlog_s: np.ndarray
    ) -> np.ndarray:  # [num_backends] seconds
        uncached = np.maximum(prompt_tokens - np.asarray(cached_tokens, dtype=np.float64), 0.0)
        backlog = np.asarray(backlog_s, dtype=np.float64) * self.load_weight
        return backlog + uncached * self.cost.prefill_s_per_token

    def _round_robin(self, ok: np.ndarray) -> int:
        n = len(ok)
        for step in range(n):
            index = (self._next + step) % n
            if ok[index]:
                self._next = index + 1
                return index
        raise AssertionError("unreachable: some backend is healthy")
