"""Pins that expire: what an API's ``cache_control: {"type": "ephemeral", "ttl": "5m"}`` asks
for. ``pin`` keeps the cached prefix of some tokens from eviction for a while (pinning the same
prefix again extends it), ``expire`` lets go of those whose time has passed. Each salt (tenant)
may hold at most ``budget_blocks`` blocks in such pins, so no tenant can pin the pool away.

Built on ``PrefixCache.pin`` / ``unpin`` (pins count, so a TTL pin never undoes a pin made
through the cache directly). The clock is injectable: tests move it instead of sleeping.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import xxhash

from prefixcache.cache import PrefixCache
from prefixcache.errors import PrefixCacheError
from prefixcache.tokens import TokenIds, as_token_array


class PinBudgetExceeded(PrefixCacheError):
    """A salt's TTL pins would hold more blocks than its budget."""


@dataclass
class TtlPin:
    tokens: np.ndarray  # [n] int32: the prefix pinned
    salt: str | None
    blocks: int  # full blocks the pin holds (what counts against the budget)
    expires: float


class TtlPins:
    """TTL pins on ``cache``: at most ``budget_blocks`` blocks per salt."""

    def __init__(self, cache: PrefixCache, budget_blocks: int,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if isinstance(budget_blocks, bool) or not isinstance(budget_blocks, int) \
                or budget_blocks < 0:  # fmt: skip
            raise ValueError(f"budget_blocks must be an int >= 0, got {budget_blocks!r}")
        self.cache = cache
        self.budget_blocks = budget_blocks
        self.clock = clock
        self._pins: dict[tuple[str | None, int, int], TtlPin] = {}
        self._deadlines: list[tuple[float, tuple[str | None, int, int]]] = []  # a heap
        self._blocks: dict[str | None, int] = {}  # salt -> blocks held by its pins
        self.expired = 0

    def __len__(self) -> int:
        return len(self._pins)

    def blocks_of(self, salt: str | None) -> int:
        """Blocks the salt's TTL pins hold now."""
        self.expire()
        return self._blocks.get(salt, 0)

    def check_room(self, salt: str | None, num_tokens: int) -> None:
        """PinBudgetExceeded unless a new pin of ``num_tokens`` tokens fits the salt's budget
        (a prefix the salt pins already would only be extended: it always fits)."""
        need = num_tokens // self.cache.block_size
        held = self.blocks_of(salt)
        if held + need > self.budget_blocks:
            raise PinBudgetExceeded(
                f"cache pins of this tenant would hold {held + need} KV blocks; its budget is "
                f"{self.budget_blocks} ({held} held now): let pins expire or pin less"
            )

    def pin(self, token_ids: TokenIds, salt: str | None, ttl: float) -> int:
        """Pin the cached prefix of ``token_ids`` for ``ttl`` seconds (from now; an existing
        pin of the same tokens is extended, never shortened). Returns the pinned tokens (0
        when nothing of them is cached). PinBudgetExceeded past the salt's budget."""
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl!r}")
        self.expire()
        tokens = as_token_array(token_ids)
        key = (salt, xxhash.xxh3_64_intdigest(tokens.tobytes()), len(tokens))
        deadline = self.clock() + ttl
        held = self._pins.get(key)
        if held is not None:
            if deadline > held.expires:
                held.expires = deadline
                heapq.heappush(self._deadlines, (deadline, key))
            return len(held.tokens)
        self.check_room(salt, len(tokens))
        pinned = self.cache.pin(tokens, salt)
        if not pinned:
            return 0
        entry = TtlPin(tokens[:pinned].copy(), salt, pinned // self.cache.block_size, deadline)
        self._pins[key] = entry
        self._blocks[salt] = self._blocks.get(salt, 0) + entry.blocks
        heapq.heappush(self._deadlines, (deadline, key))
        return pinned

    def expire(self) -> int:
        """Unpin every pin whose time has passed; returns how many."""
        now = self.clock()
        count = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, key = heapq.heappop(self._deadlines)
            entry = self._pins.get(key)
            if entry is None or entry.expires != deadline:
                continue  # extended since: a later deadline stands for it
            del self._pins[key]
            self._blocks[entry.salt] -= entry.blocks
            if not self._blocks[entry.salt]:
                del self._blocks[entry.salt]
            self.cache.unpin(entry.tokens, entry.salt)
            count += 1
        self.expired += count
        return count

    def clear(self) -> int:
        """Unpin every TTL pin now; returns how many."""
        count = len(self._pins)
        for entry in self._pins.values():
            self.cache.unpin(entry.tokens, entry.salt)
        self._pins.clear()
        self._deadlines.clear()
        self._blocks.clear()
        return count

    def stats(self) -> dict[str, int]:
        return {"ttl_pins": len(self._pins), "ttl_pinned_blocks": sum(self._blocks.values()),
                "ttl_pins_expired": self.expired}  # fmt: skip

    def check_invariants(self) -> None:
        """AssertionError if the pins, deadlines and per-salt counts disagree."""
        totals: dict[str | None, int] = {}
        for key, entry in self._pins.items():
            assert key[0] == entry.salt and key[2] >= len(entry.tokens)
            assert any(d == entry.expires and k == key for d, k in self._deadlines), key
            totals[entry.salt] = totals.get(entry.salt, 0) + entry.blocks
        assert totals == self._blocks, (totals, self._blocks)
        self.cache.check_invariants()
