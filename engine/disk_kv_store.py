"""The disk KV tier's store: one record per full block (``disk_record``), crash-safe, found
again after a restart.

A store lives in ``DIR/<store key>/``, the key a digest of everything that decides a block's
bytes (model fingerprint, element dtype, block size, layers, kv heads, head_dim, the format's
version): another model, dtype or block size uses another folder and never reads these files
as its own. A record is ``<namespace digest>-<block hash>.kvb``, mode 0600, written to a
temporary file and renamed into place, so a crash leaves either the old state or the whole
record. At start the index is rebuilt from the records' leads; temporary files and records
whose lead does not parse or check, or whose size is not the one it implies, are deleted and
counted (``dropped``). A payload is checked when it is read; a record that fails is deleted and
reads as a miss. Records beyond ``capacity`` bytes go least recently used first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prefixcache.engine.disk_record import (
    ALIGN,
    RecordFiles,
    aligned_array,
    direct_io_works,
    is_temporary,
)

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
SUFFIX = ".kvb"


def store_key(fingerprint: str, dtype: str, block_size: int, layers: int, kv_heads: int,
              head_dim: int) -> str:  # fmt: skip
    """The folder name of a store: a digest of what decides a block's bytes."""
    fields = [FORMAT_VERSION, fingerprint, dtype, block_size, layers, kv_heads, head_dim]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:32]


def namespace_digest(name: Any) -> str:
    return hashlib.sha256(json.dumps(name, default=list).encode()).hexdigest()[:16]


@dataclass
class DiskRecord:
    """What the index keeps of one record (its payload stays on disk)."""

    path: Path
    parent: int
    tokens: tuple[int, ...]
    size: int
    lead_bytes: int  # the bytes before the payload


class DiskKVStore:
    """Records of ``record_bytes`` payload bytes under ``root / key``, at most ``capacity``
    bytes of files, least recently used deleted first. ``padded_bytes``: the payload's size
    in a record, and the size of the buffers ``write`` and ``read`` take."""

    def __init__(self, root: Path, key: str, record_bytes: int, capacity: int,
                 direct_io: bool | None = None) -> None:  # fmt: skip
        """``direct_io``: use ``O_DIRECT`` (None: where the folder's file system takes it)."""
        self.folder = Path(root) / key
        self.key = key
        self.record_bytes = record_bytes
        self.capacity = capacity
        self.records: OrderedDict[tuple[str, int], DiskRecord] = OrderedDict()  # LRU first
        self.bytes = 0
        self.dropped = 0  # records found torn or corrupt (at start or when read)
        self.written = 0
        self.evicted = 0
        self.lock = threading.RLock()  # the index: read by the engine thread, grown by a writer
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            probe = self.folder / f".tmp-probe-{threading.get_ident()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as error:
            raise ValueError(f"the KV disk directory {root} is not writable: {error}") from error
        direct = direct_io_works(self.folder) if direct_io is None else direct_io
        self.files = RecordFiles(self.folder, key, record_bytes, direct)
        self.padded_bytes = self.files.padded_bytes
        self._scan()

    # ------------------------------------------------------------------ index
    def key_of(self, name: Any, block_hash: int) -> tuple[str, int]:
        return (namespace_digest(name), block_hash)

    def find(self, name: Any, parent_hash: int, hashes: list[int],
             tokens: list[tuple[int, ...]]) -> list[tuple[str, int]]:  # fmt: skip
        """Keys of the longest run of ``hashes`` held here whose parent and tokens match (the
        namespace name itself is checked when the payload is read)."""
        found = []
        previous = parent_hash
        with self.lock:
            for block_hash, block_tokens in zip(hashes, tokens, strict=True):
                key = self.key_of(name, block_hash)
                record = self.records.get(key)
                if record is None or record.parent != previous or record.tokens != block_tokens:
                    break
                found.append(key)
                previous = block_hash
        return found

    def __contains__(self, key: tuple[str, int]) -> bool:
        with self.lock:
            return key in self.records

    # ------------------------------------------------------------------ files
    def write(self, name: Any, block_hash: int, parent: int, tokens: tuple[int, ...],
              payload: bytes | memoryview | np.ndarray) -> None:  # fmt: skip
        """Write one record (the index is locked only to add it); evicts old records past the
        capacity. ``payload``: ``record_bytes``, or a ``padded_bytes`` page-aligned buffer
        zero past them (written as it is; anything else is copied into one first). Any thread;
        OSError when the disk fails."""
        key = self.key_of(name, block_hash)
        if key in self:
            return
        padded = _as_padded(payload, self.record_bytes, self.padded_bytes)
        if padded is None:
            return
        path = self.folder / f"{key[0]}-{block_hash:016x}{SUFFIX}"
        fields = {"name": name, "hash": block_hash, "parent": parent, "tokens": list(tokens)}
        lead_bytes = self.files.write(path, fields, padded)
        size = self.files.file_bytes(lead_bytes)
        with self.lock:
            if key in self.records:  # written meanwhile: the same bytes under the same name
                return
            self.records[key] = DiskRecord(path, parent, tuple(tokens), size, lead_bytes)
            self.bytes += size
            self.written += 1
            while self.bytes > self.capacity and self.records:
                self._delete(next(iter(self.records)), evicted=True)

    def read(self, key: tuple[str, int], name: Any,
             out: np.ndarray | None = None) -> np.ndarray | None:  # fmt: skip
        """The payload of ``key`` (``record_bytes`` uint8), read into ``out`` when given (a
        ``padded_bytes`` page-aligned buffer; the payload is its first ``record_bytes``),
        checked (namespace, store, sizes, checksums); None, with the record deleted and
        counted, if it fails. Any thread: the file is read outside the lock."""
        with self.lock:
            record = self.records.get(key)
        if record is None:
            return None
        buffer = aligned_array(1, self.padded_bytes)[0] if out is None else out
        try:
            fields = self.files.read(record.path, record.lead_bytes, record.size, buffer)
            if fields["name"] != json.loads(json.dumps(name, default=list)):
                raise ValueError("another namespace under the same digest")
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("KV disk record %s dropped: %s", record.path.name, error)
            with self.lock:
                self.dropped += 1
                if self.records.get(key) is record:
                    self._delete(key)
            return None
        with self.lock:
            if key in self.records:
                self.records.move_to_end(key)
        return buffer[: self.record_bytes]

    def clear(self) -> int:
        with self.lock:
            count = len(self.records)
            for key in list(self.records):
                self._delete(key)
        return count

    def _delete(self, key: tuple[str, int], evicted: bool = False) -> None:
        record = self.records.pop(key)
        self.bytes -= record.size
        self.evicted += evicted
        record.path.unlink(missing_ok=True)

    def _scan(self) -> None:
        """Rebuild the index from the folder, oldest files first (LRU order), reading each
        record's header only: drop the temporary files of interrupted writes and records whose
        header or length does not check (a torn record is short); the payload's checksums are
        checked when it is read."""
        entries = []
        for path in self.folder.iterdir():
            if is_temporary(path):
                path.unlink(missing_ok=True)
                self.dropped += 1
                continue
            if path.suffix != SUFFIX:
                continue
            try:
                header, size = self.files.read_header(path)
                fields = header.fields
                key = (namespace_digest(fields["name"]), int(fields["hash"]))
                record = DiskRecord(path, int(fields["parent"]), tuple(fields["tokens"]), size,
                                    header.lead_bytes)  # fmt: skip
                entries.append((path.stat().st_mtime_ns, key, record))
            except (OSError, ValueError, KeyError, TypeError) as error:
                log.warning("KV disk record %s dropped at start: %s", path.name, error)
                path.unlink(missing_ok=True)
                self.dropped += 1
        for _, key, record in sorted(entries, key=lambda e: e[0]):
            self.records[key] = record
            self.bytes += record.size
        while self.bytes > self.capacity and self.records:
            self._delete(next(iter(self.records)), evicted=True)

    def stats(self) -> dict[str, int]:
        with self.lock:
            return self._stats()

    def _stats(self) -> dict[str, int]:
        return {
            "disk_tier_records": len(self.records), "disk_tier_bytes": self.bytes,
            "disk_tier_capacity_bytes": self.capacity, "disk_tier_written": self.written,
            "disk_tier_dropped_records": self.dropped, "disk_tier_evictions": self.evicted,
        }  # fmt: skip


def _as_padded(payload: bytes | memoryview | np.ndarray, record_bytes: int,
               padded_bytes: int) -> np.ndarray | None:  # fmt: skip
    """``payload`` as a page-aligned, zero-padded ``padded_bytes`` buffer (itself when it is
    one already); None when it is neither ``record_bytes`` nor ``padded_bytes`` long."""
    array = np.frombuffer(payload, dtype=np.uint8) if not isinstance(payload, np.ndarray) \
        else payload.reshape(-1).view(np.uint8)  # fmt: skip
    if array.nbytes == padded_bytes and array.ctypes.data % ALIGN == 0:
        return array
    if array.nbytes not in (record_bytes, padded_bytes):
        return None
    padded = aligned_array(1, padded_bytes)[0]
    padded[:record_bytes] = array[:record_bytes]
    return padded
