"""The disk tier's record files: aligned leads and payloads, read back bitwise with and without
O_DIRECT; a file system that refuses O_DIRECT gets the same records through the page cache."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from prefixcache.engine.disk_kv_store import DiskKVStore
from prefixcache.engine.disk_record import ALIGN, aligned_array, direct_io_works

RECORD = 3 * 1000 + 17  # not a multiple of the alignment: the payload is padded
NAME = (None, ())


def payload(seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, RECORD, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("direct", [False, True])
def test_records_read_back_bitwise(tmp_path: Path, direct: bool) -> None:
    if direct and not direct_io_works(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    store = DiskKVStore(tmp_path, "key", RECORD, 1 << 30, direct_io=direct)
    assert store.files.direct is direct and store.padded_bytes % ALIGN == 0
    rows = aligned_array(2, store.padded_bytes)
    rows[0, :RECORD] = np.frombuffer(payload(0), dtype=np.uint8)
    store.write(NAME, 1, 0, (1, 2), rows[0])  # an aligned, padded row: written as it is
    store.write(NAME, 2, 1, (3, 4), payload(1))  # plain bytes: copied into one first
    for path in store.folder.glob("*.kvb"):
        assert path.stat().st_size % ALIGN == 0
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = DiskKVStore(tmp_path, "key", RECORD, 1 << 30, direct_io=not direct)  # the index
    for block_hash, seed in ((1, 0), (2, 1)):
        key = again.key_of(NAME, block_hash)
        assert bytes(again.read(key, NAME)) == payload(seed)
        out = aligned_array(1, again.padded_bytes)[0]
        assert bytes(again.read(key, NAME, out)) == payload(seed)
    assert again.dropped == 0


def test_a_file_system_without_direct_io_falls_back(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def refuse_direct(path, flags, *args):  # as tmpfs before Linux 6.6 answers O_DIRECT
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refuse_direct)
    assert not direct_io_works(tmp_path)
    store = DiskKVStore(tmp_path, "key", RECORD, 1 << 30)
    assert not store.files.direct
    store.write(NAME, 7, 0, (1,), payload(2))
    assert bytes(store.read(store.key_of(NAME, 7), NAME)) == payload(2)
    assert not [p for p in store.folder.iterdir() if p.name.startswith(".tmp-")]


def test_a_wrong_sized_payload_is_not_written(tmp_path: Path) -> None:
    store = DiskKVStore(tmp_path, "key", RECORD, 1 << 30)
    store.write(NAME, 1, 0, (1,), b"short")
    assert len(store.records) == 0 and not list(store.folder.glob("*.kvb"))
