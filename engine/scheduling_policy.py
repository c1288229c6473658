"""The order in which waiting requests are admitted.

``fcfs``: arrival order. ``cache-aware``: the request with the longest cached prefix first (its
prefill is cheapest and its blocks are hot), but no request waits more than ``max_wait_steps``
scheduler steps behind later arrivals: overdue requests go first, in arrival order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prefixcache import PrefixCache
from prefixcache.engine.request import Request

POLICIES = ("fcfs", "cache-aware")


class SchedulingPolicy:
    def __init__(self, name: str = "fcfs", max_wait_steps: int = 64) -> None:
        if name not in POLICIES:
            raise ValueError(f"unknown scheduling policy {name!r}; choose from {POLICIES}")
        self.name = name
        self.max_wait_steps = max_wait_steps
        self._first_seen: dict[str, int] = {}

    def order(self, waiting: Sequence[Request], cache: PrefixCache, step: int) -> Iterable[Request]:
        """Waiting requests in admission order (a snapshot: the caller may mutate ``waiting``)."""
        if self.name == "fcfs" or len(waiting) < 2:
            return list(waiting)
        seen = self._first_seen
        live = {request.request_id for request in waiting}
        for key in [key for key in seen if key not in live]:
            del seen[key]
        for request in waiting:
            seen.setdefault(request.request_id, step)
        overdue = [r for r in waiting if step - seen[r.request_id] >= self.max_wait_steps]
        fresh = [r for r in waiting if step - seen[r.request_id] < self.max_wait_steps]
        fresh.sort(key=lambda r: -cache.lookup(r.all_tokens, r.salt))
        return overdue + fresh
