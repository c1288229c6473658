"""StagingRows: a buffer is lent again only once every row handed out of it is gone."""

from __future__ import annotations

import gc

from prefixcache.engine.staging_rows import StagingRows


def test_a_buffer_comes_back_once_its_rows_are_gone() -> None:
    staging = StagingRows(width=32)
    buffer = staging.take(10)
    assert buffer.shape == (64, 32)
    rows = staging.lend(buffer, 10)
    assert len(rows) == 10 and all(r.shape == (32,) for r in rows)
    other = staging.take(10)  # the first is still out: a new one
    assert other.data_ptr() != buffer.data_ptr()
    staging.lend(other, 0)  # nothing read: idle at once
    first_ptr = buffer.data_ptr()
    del buffer
    keep = rows[3]
    del rows
    gc.collect()
    assert staging.take(64).data_ptr() != first_ptr  # one row still alive
    del keep
    gc.collect()
    ptrs = {staging.take(64).data_ptr(), staging.take(64).data_ptr()}
    assert first_ptr in ptrs
    assert staging.allocated == 3


def test_idle_buffers_are_bounded() -> None:
    staging = StagingRows(width=1024, keep_bytes=100 * 1024)
    big, small = staging.take(128), staging.take(64)  # 128 KiB and 64 KiB
    staging.lend(big, 0)
    staging.lend(small, 0)
    assert staging.idle_bytes == 64 * 1024  # the big one alone is over the bound: not kept
