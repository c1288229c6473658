"""The runner's batching of copy-on-write copies: in order, no batch writes what it reads."""

from __future__ import annotations

from prefixcache import CopyOp
from prefixcache.engine.model_runner import copy_waves


def test_independent_copies_run_as_one_batch() -> None:
    ops = [CopyOp(1, 5), CopyOp(2, 6, 3), CopyOp(1, 7)]
    assert copy_waves(ops) == [ops]
    assert copy_waves([]) == []


def test_a_block_read_then_reused_as_a_destination_starts_a_new_batch() -> None:
    """Block 3 is read by the first copy, then freed and handed out as a destination: its
    old contents reach block 5 before block 8's overwrite them."""
    ops = [CopyOp(3, 5), CopyOp(4, 6), CopyOp(8, 3), CopyOp(9, 10)]
    assert copy_waves(ops) == [ops[:2], ops[2:]]


def test_a_block_written_then_read_starts_a_new_batch() -> None:
    ops = [CopyOp(1, 2), CopyOp(2, 3)]
    assert copy_waves(ops) == [[ops[0]], [ops[1]]]
