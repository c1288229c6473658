"""The work runs the compiled GEMMs and the attention's packing share out their items with
(work_runs.h): every item taken exactly once, a thread's own run first and in order, then the
other runs from their backs, whatever the number of threads that actually run."""

from __future__ import annotations

import ctypes

import pytest
import torch

from prefixcache.kernels.cpu.build import load_library, unavailable_reason

LIB = load_library()
if LIB is None:
    pytest.skip(
        f"compiled CPU kernels unavailable: {unavailable_reason()}", allow_module_level=True
    )


def drain_alone(n: int, runs: int, tid: int) -> list[int]:
    """The items thread ``tid`` takes when it is the only one running."""
    out = torch.full((max(n, 1),), -1, dtype=torch.int64)
    count = LIB.pc_work_runs_drain(n, runs, tid, ctypes.c_void_p(out.data_ptr()))
    return out[:count].tolist()


@pytest.mark.parametrize(("n", "runs", "tid"), [(10, 2, 0), (10, 2, 1), (7, 3, 2), (5, 8, 3)])
def test_a_lone_thread_takes_its_run_then_the_others_from_their_backs(
    n: int, runs: int, tid: int
) -> None:
    bounds = [(n * r // runs, n * (r + 1) // runs) for r in range(runs)]
    own = list(range(*bounds[tid]))
    stolen = [
        item
        for r in range(1, runs)
        for item in reversed(range(*bounds[(tid + r) % runs]))
    ]
    assert drain_alone(n, runs, tid) == own + stolen


def test_no_items_means_nothing_taken() -> None:
    assert drain_alone(0, 4, 1) == []


@pytest.mark.parametrize(("n", "runs"), [(1, 2), (37, 2), (1000, 4), (5, 7)])
def test_threads_draining_at_once_take_every_item_exactly_once(n: int, runs: int) -> None:
    repeats = 200
    taken = torch.zeros(n, dtype=torch.int32)
    LIB.pc_work_runs_stress(n, runs, repeats, ctypes.c_void_p(taken.data_ptr()))
    assert torch.equal(taken, torch.full((n,), repeats, dtype=torch.int32))
