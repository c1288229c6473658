"""When requests are sent: closed loop (sequential or N in flight) or open loop (a Poisson or
gamma-bursty arrival process, or a trace's own timestamps), optionally capped in flight."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from prefixcache.integrations.bench.bench_request import BenchRequest
from prefixcache.integrations.bench.request_result import RequestResult

SendFunction = Callable[[BenchRequest], Awaitable[RequestResult]]


@dataclass(frozen=True)
class LoadConfig:
    """``request_rate`` None: closed loop with ``concurrency`` in flight (None -> 1, i.e.
    sequential). Otherwise requests arrive at ``request_rate`` per second with gamma
    inter-arrival gaps of shape ``burstiness`` (1.0 = Poisson; < 1 burstier), at most
    ``concurrency`` in flight when given. ``use_timestamps`` replays trace timestamps
    (when every request has one and no rate is given)."""

    concurrency: int | None = None
    request_rate: float | None = None
    burstiness: float = 1.0
    seed: int = 0
    use_timestamps: bool = True

    def __post_init__(self) -> None:
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool) or self.concurrency <= 0
        ):
            raise ValueError(f"concurrency must be a positive integer, got {self.concurrency}")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError(f"request rate must be > 0, got {self.request_rate}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")

    def describe(self, requests: Sequence[BenchRequest] = ()) -> str:
        """How ``requests`` are sent: a rate, the trace's own timestamps, or a closed loop."""
        if self.request_rate is not None:
            cap = f", max {self.concurrency} in flight" if self.concurrency else ""
            return f"{self.request_rate:g} req/s (burstiness {self.burstiness:g}{cap})"
        if schedule_for(requests, self) is not None:
            cap = f", max {self.concurrency} in flight" if self.concurrency else ""
            return f"at the trace's timestamps{cap}"
        return "sequential" if (self.concurrency or 1) == 1 else f"{self.concurrency} in flight"


def arrival_offsets(count: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Send times in seconds after the start, the first at 0; shape [count]. Gaps are
    Gamma(shape=burstiness, scale=1 / (rate * burstiness)): mean 1 / rate for any shape."""
    rng = np.random.default_rng([seed, 7])
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=max(count - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])[:count]


def schedule_for(requests: Sequence[BenchRequest], config: LoadConfig) -> np.ndarray | None:
    """Open-loop send offsets for ``requests``, or None for a closed loop."""
    if config.request_rate is not None:
        return arrival_offsets(len(requests), config.request_rate, config.burstiness, config.seed)
    timestamps = [r.timestamp for r in requests]
    if config.use_timestamps and requests and all(t is not None for t in timestamps):
        first = min(t for t in timestamps if t is not None)
        return np.array([t - first for t in timestamps if t is not None], dtype=np.float64)
    return None


async def run_load(
    requests: Sequence[BenchRequest],
    send: SendFunction,
    config: LoadConfig,
    stop: asyncio.Event,
    on_result: Callable[[RequestResult], None] = lambda result: None,
) -> list[RequestResult]:
    """Send every request per ``config``; returns the finished results in send order.

    Setting ``stop`` sends nothing new and cancels what is in flight: only requests that
    finished are returned (the caller reports what was measured so far).
    """
    offsets = schedule_for(requests, config)
    results: dict[int, RequestResult] = {}

    async def one(index: int) -> None:
        result = await send(requests[index])
        results[index] = result
        on_result(result)

    if offsets is None:
        tasks = _closed_loop(len(requests), config.concurrency or 1, one)
    else:
        tasks = [asyncio.ensure_future(_open_loop(offsets, config.concurrency, one))]
    stopper = asyncio.ensure_future(stop.wait())
    try:
        pending = set(tasks)
        while pending and not stop.is_set():
            _, pending = await asyncio.wait(
                pending | {stopper}, return_when=asyncio.FIRST_COMPLETED
            )
            pending.discard(stopper)
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]  # a bug, not a request error
    finally:
        stopper.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, stopper, return_exceptions=True)
    return [results[index] for index in sorted(results)]


def _closed_loop(
    count: int, concurrency: int, one: Callable[[int], Awaitable[None]]
) -> list[asyncio.Future]:
    next_index = iter(range(count))

    async def worker() -> None:
        for index in next_index:  # shared iterator: each index is taken once
            await one(index)

    return [asyncio.ensure_future(worker()) for _ in range(min(concurrency, count))]


async def _open_loop(
    offsets: np.ndarray, concurrency: int | None, one: Callable[[int], Awaitable[None]]
) -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    limit = asyncio.Semaphore(concurrency) if concurrency else None
    in_flight: list[asyncio.Future] = []

    async def limited(index: int) -> None:
        if limit is None:
            await one(index)
            return
        async with limit:
            await one(index)

    try:
        for index, offset in enumerate(offsets):
            delay = began + float(offset) - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            in_flight.append(asyncio.ensure_future(limited(index)))
        await asyncio.gather(*in_flight)
    finally:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
