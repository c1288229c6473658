"""A thread that polls a server's /health while other requests run, recording each answer.

How long the event loop was held shows as the latency of the /health answers that overlapped
a request (``during``). Used by ``loop_stall.py`` and by the server's tests.
"""

from __future__ import annotations

import threading
import time

import httpx

POLL_INTERVAL_S = 0.01  # a probe, not a load: /health itself answers in about 1 ms


class HealthProbe:
    """Polls ``base_url``/health on a connection of its own, from a thread, while entered."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.samples: list[tuple[float, float, int]] = []  # (start, seconds, status)
        self._stop = threading.Event()
        self._sampled = threading.Condition()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=600) as client:
            while not self._stop.wait(POLL_INTERVAL_S):
                start = time.perf_counter()
                status = client.get("/health").status_code
                with self._sampled:
                    self.samples.append((start, time.perf_counter() - start, status))
                    self._sampled.notify_all()

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(600)

    def during(self, start: float, end: float) -> list[float]:
        """Latencies of the answers whose request overlapped [start, end]; a window shorter
        than the poll interval may fall between two probes: then the first answer begun after
        it (waited for), so every window has one."""
        overlapping = [seconds for begun, seconds, _ in self.samples
                       if begun <= end and begun + seconds >= start]  # fmt: skip
        if overlapping:
            return overlapping
        with self._sampled:
            self._sampled.wait_for(lambda: self.samples and self.samples[-1][0] > end, 600)
            return [next(seconds for begun, seconds, _ in self.samples if begun > end)]

    @property
    def statuses(self) -> set[int]:
        return {status for _, _, status in self.samples}
