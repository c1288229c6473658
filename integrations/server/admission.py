"""A bounded admission queue: past ``max_pending`` requests in flight, answer 429, not grow.

The engine's own waiting queue is unbounded; this guard sits in front of it. A request takes
a ``Ticket`` before it is queued and gives it back when its response is done (or its client
left). ``Ticket.release`` is idempotent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prefixcache.integrations.server.errors import ApiError


class Ticket:
    """One admitted request's place in the queue."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._give_back()


class Admission:
    """Counts requests in flight; ``admit`` raises ApiError(429) when the queue is full."""

    def __init__(self, max_pending: int, on_reject: Callable[[], None] | None = None) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self._in_flight = 0
        self._lock = threading.Lock()
        self._on_reject = on_reject

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def admit(self) -> Ticket:
        with self._lock:
            if self._in_flight >= self.max_pending:
                if self._on_reject is not None:
                    self._on_reject()
                raise ApiError(
                    429,
                    f"the server is at capacity ({self.max_pending} requests in flight); "
                    "retry later",
                    code="queue_full",
                )
            self._in_flight += 1
        return Ticket(self)

    def _give_back(self) -> None:
        with self._lock:
            self._in_flight -= 1
