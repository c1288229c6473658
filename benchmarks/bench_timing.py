"""Median-of-repeats wall-clock timing for the benchmarks (no timing assertions anywhere)."""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any


def median_ns(
    timed: Callable[[Any], Any],
    repeats: int,
    setup: Callable[[], Any] = lambda: None,
    after: Callable[[Any], None] = lambda result: None,
) -> float:
    """Median wall time of ``timed(setup())`` over ``repeats``; ``after(result)`` runs untimed."""
    samples = []
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            state = setup()
            start = time.perf_counter_ns()
            result = timed(state)
            samples.append(time.perf_counter_ns() - start)
            after(result)
    finally:
        if was_enabled:
            gc.enable()
    return statistics.median(samples)


def median_ms(
    timed: Callable[[Any], Any],
    repeats: int,
    setup: Callable[[], Any] = lambda: None,
    after: Callable[[Any], None] = lambda result: None,
) -> float:
    """`median_ns` in milliseconds."""
    return median_ns(timed, repeats, setup, after) / 1e6


def discard(result: Any) -> None:
    """An `after` hook that does nothing."""


def interleaved_median_ms(
    timers: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]], rounds: int
) -> dict[str, float]:
    """Median ms of each ``timed()`` in ``timers`` (name -> (timed, untimed after(result))).

    Each round runs every timer in turn, so load changes on a shared machine hit all of them
    alike and their ratios stay fair; each timed call follows one untimed warm-up call of the
    same timer, so no timer pays for the cache lines the previous one evicted.
    """
    samples: dict[str, list[int]] = {name: [] for name in timers}
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, (timed, after) in timers.items():
                after(timed())
                start = time.perf_counter_ns()
                result = timed()
                samples[name].append(time.perf_counter_ns() - start)
                after(result)
    finally:
        if was_enabled:
            gc.enable()
    return {name: statistics.median(values) / 1e6 for name, values in samples.items()}


class MethodTimer:
    """Seconds spent inside some methods of one object, summed over their calls.

    Each method is wrapped on the instance (the class is untouched) until ``remove()``; the
    wrappers' own two clock reads per call are counted too, so a comparison of two
    configurations should time the same methods in both.
    """

    def __init__(self, target: Any, names: Iterable[str]) -> None:
        self.seconds = 0.0
        self._target = target
        self._names = list(names)
        for name in self._names:
            setattr(target, name, self._timed(getattr(target, name)))

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed

    def take(self) -> float:
        """The seconds counted since the last ``take()`` (or since wrapping); restarts the count."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def remove(self) -> None:
        """Restore the instance's own methods."""
        for name in self._names:
            delattr(self._target, name)


def reference_first_medians(
    variants: dict[str, Callable[[], Any]], repeats: int
) -> dict[str, float]:
    """Median seconds of each variant after one untimed call of each, all called once per
    repeat: "reference" first, then the others in an order rotated from one repeat to the
    next, so that of the variants compared with each other (a kernel and the kernel at
    another revision) each follows the reference, which leaves the caches full of its own
    data, equally often."""
    for run in variants.values():
        run()
    others = [name for name in variants if name != "reference"]
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(repeats):
        shift = repeat % len(others)
        for name in ["reference", *others[shift:], *others[:shift]]:
            start = time.perf_counter()
            variants[name]()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}
