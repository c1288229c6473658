"""The files of the disk KV tier: one record per full block, crash-safe, found again after a
restart.

A store lives in ``DIR/<store key>/``, the key a digest of everything that decides a block's
bytes (model fingerprint, element dtype, block size, layers, kv heads, head_dim, the format's
version): another model, dtype or block size uses another folder and never reads these files
as its own. A record (``<namespace digest>-<block hash>.kvb``, mode 0600) is a magic line, a
JSON header (the store key, the namespace name, block hash, parent hash, tokens, payload size),
the payload (every layer's K block, then every layer's V block, raw bytes) and
an xxh3-64 of all that came before. It is written to a temporary file and renamed into place,
so a crash leaves either the old state or the whole record; at start, temporary files and
records whose header does not parse or check are deleted and counted (``dropped``). A payload
is checked again when it is read; a record that fails is deleted and reads as a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

log = logging.getLogger(__name__)

MAGIC = b"PCKV1\n"
FORMAT_VERSION = 1
SUFFIX = ".kvb"
_LENGTH = struct.Struct("<I")  # header bytes
_CHECK = struct.Struct("<Q")  # trailing xxh3-64


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


class DiskKVStore:
    """Records of ``record_bytes`` payload bytes under ``root / key``, at most ``capacity``
    bytes of files, least recently used deleted first."""

    def __init__(self, root: Path, key: str, record_bytes: int, capacity: int) -> None:
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
            with tempfile.NamedTemporaryFile(dir=self.folder, prefix=".probe-"):
                pass
        except OSError as error:
            raise ValueError(f"the KV disk directory {root} is not writable: {error}") from error
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
              payload: bytes | memoryview) -> None:  # fmt: skip
        """Write one record (temp file + rename; the index is locked only to add it); evicts
        old records past the capacity. Any thread."""
        key = self.key_of(name, block_hash)
        if key in self or len(payload) != self.record_bytes:
            return
        header = json.dumps({
            "store": self.key, "name": name, "hash": block_hash, "parent": parent,
            "tokens": list(tokens), "payload": len(payload),
        }, default=list).encode()  # fmt: skip
        parts = [MAGIC, _LENGTH.pack(len(header)), header, payload]
        check = xxhash.xxh3_64()
        for part in parts:
            check.update(part)
        parts.append(_CHECK.pack(check.intdigest()))
        size = sum(len(part) for part in parts)
        path = self.folder / f"{key[0]}-{block_hash:016x}{SUFFIX}"
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:  # mkstemp creates it 0600
                f.writelines(parts)
            os.replace(tmp, path)
        except OSError:
            Path(tmp).unlink(missing_ok=True)
            raise
        with self.lock:
            if key in self.records:  # written meanwhile: the same bytes under the same name
                return
            self.records[key] = DiskRecord(path, parent, tuple(tokens), size)
            self.bytes += size
            self.written += 1
            while self.bytes > self.capacity and self.records:
                self._delete(next(iter(self.records)), evicted=True)

    def read(self, key: tuple[str, int], name: Any) -> memoryview | None:
        """The payload of ``key``, checked (namespace, sizes, both checksums); None, with the
        record deleted and counted, if it fails."""
        with self.lock:
            record = self.records.get(key)
        if record is None:
            return None
        try:
            data = bytearray(record.size)
            with open(record.path, "rb") as f:
                if f.readinto(data) != record.size or f.read(1):
                    raise ValueError("torn: not the length it had at start")
            header, payload = _parse(data, self.key)
            if header["name"] != json.loads(json.dumps(name, default=list)):
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
        return payload

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
            if path.name.startswith(".tmp-"):
                path.unlink(missing_ok=True)
                self.dropped += 1
                continue
            if path.suffix != SUFFIX:
                continue
            try:
                header, size = _read_header(path, self.key)
                key = (namespace_digest(header["name"]), int(header["hash"]))
                record = DiskRecord(path, int(header["parent"]), tuple(header["tokens"]), size)
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


def _read_header(path: Path, store: str) -> tuple[dict[str, Any], int]:
    """(header, file size) of a record, checked as far as the header tells (magic, store key,
    the length the payload size implies); ValueError otherwise."""
    with open(path, "rb") as f:
        lead = f.read(len(MAGIC) + _LENGTH.size)
        if len(lead) < len(MAGIC) + _LENGTH.size or not lead.startswith(MAGIC):
            raise ValueError("not a record (bad magic or too short)")
        (length,) = _LENGTH.unpack_from(lead, len(MAGIC))
        header = json.loads(f.read(length))
        size = f.seek(0, os.SEEK_END)
    if header.get("store") != store:
        raise ValueError("written by another model, dtype or block size")
    if size != len(lead) + length + int(header["payload"]) + _CHECK.size:
        raise ValueError("torn: shorter or longer than its header says")
    return header, size


def _parse(data: bytearray, store: str) -> tuple[dict[str, Any], memoryview]:
    """(header, payload view) of a whole record; ValueError when any check fails."""
    view = memoryview(data)
    if len(data) < len(MAGIC) + _LENGTH.size + _CHECK.size or not data.startswith(MAGIC):
        raise ValueError("not a record (bad magic or too short)")
    body, check = view[: -_CHECK.size], _CHECK.unpack(view[-_CHECK.size :])[0]
    if xxhash.xxh3_64_intdigest(body) != check:
        raise ValueError("checksum mismatch (torn or corrupt)")
    (length,) = _LENGTH.unpack_from(body, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    header = json.loads(bytes(body[start : start + length]))
    payload = body[start + length :]
    if header.get("store") != store:
        raise ValueError("written by another model, dtype or block size")
    if header["payload"] != len(payload):
        raise ValueError("payload size mismatch")
    return header, payload
