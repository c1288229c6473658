"""`MethodTimer` (benchmarks/bench_timing.py) and the cache calls engine_bench.py times."""

import ast
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_timing import MethodTimer  # noqa: E402
from engine_bench import SCHEDULER_CACHE_CALLS  # noqa: E402


class Worker:
    def __init__(self) -> None:
        self.inside = 0.0  # seconds the method measured of itself

    def work(self, n: int) -> int:
        start = time.perf_counter()
        total = sum(i * i for i in range(n))
        self.inside += time.perf_counter() - start
        return total

    def other(self) -> str:
        return "untimed"


def test_counts_the_time_inside_the_wrapped_methods_only():
    worker = Worker()
    timer = MethodTimer(worker, ["work"])
    start = time.perf_counter()
    assert worker.work(20_000) == sum(i * i for i in range(20_000))
    assert worker.other() == "untimed"
    outside = time.perf_counter() - start
    counted = timer.take()
    assert worker.inside <= counted <= outside
    assert timer.take() == 0.0  # take() restarts the count
    worker.work(10)
    assert timer.seconds > 0.0


def test_remove_restores_the_instance_methods():
    worker = Worker()
    timer = MethodTimer(worker, ["work", "other"])
    assert "work" in vars(worker)
    timer.remove()
    assert "work" not in vars(worker) and "other" not in vars(worker)
    worker.work(100)
    assert timer.seconds == 0.0


def test_engine_bench_times_every_cache_method_the_scheduler_calls():
    tree = ast.parse((ROOT / "engine" / "scheduler.py").read_text())
    called = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "cache"
    }
    assert {"match", "insert", "allocate", "release"} <= called  # the walk found the calls
    assert called <= set(SCHEDULER_CACHE_CALLS)
