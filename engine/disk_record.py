"""One record of the disk KV tier: the file format and its reads and writes.

A record is a **lead** — a magic line, the header's length, an xxh3-64 of the header, the
JSON header (store key, namespace name, block hash, parent hash, tokens, payload size, an
xxh3-64 of the padded payload) — zero-padded to a multiple of ``ALIGN``, then the **payload**
(every layer's K block, then every layer's V block, raw bytes) zero-padded to a multiple of
``ALIGN``. Every byte of the file is covered by one of the two checksums.

Both parts being aligned, a record is written and read with ``O_DIRECT`` where the file system
allows it: the bytes move between the caller's page-aligned buffer and the device without a
copy through the page cache. The page cache copy cost more CPU than the model could spare on a
small machine (0.5-1 ms of kernel time per 368 KB record at times, on two cores that run the
model), and the disk tier is a tier of its own, not something the page cache should double.
Where ``O_DIRECT`` is refused (tmpfs, some overlay file systems) the same bytes go through the
page cache.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

MAGIC = b"PCKV2\n"
ALIGN = 4096  # bytes: the largest logical block size O_DIRECT asks alignment to
_LEAD = struct.Struct("<IQ")  # header length, xxh3-64 of the header
_TMP_PREFIX = ".tmp-"


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of ``ALIGN``."""
    return -(-nbytes // ALIGN) * ALIGN


def aligned_array(rows: int, width: int) -> np.ndarray:  # [rows, width] uint8, page-aligned
    """Zeroed memory starting on a page boundary (``width`` a multiple of ``ALIGN`` keeps every
    row aligned), for the buffers ``O_DIRECT`` reads into and writes from."""
    mapping = mmap.mmap(-1, max(rows * width, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(mapping, dtype=np.uint8, count=rows * width).reshape(rows, width)


def direct_io_works(folder: Path) -> bool:
    """Whether files in ``folder`` take ``O_DIRECT`` reads and writes of aligned buffers."""
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = folder / f"{_TMP_PREFIX}direct-{uuid.uuid4().hex}"
    page = aligned_array(1, ALIGN)[0]
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
        try:
            written = os.pwrite(fd, page, 0)
        finally:
            os.close(fd)
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
        try:
            read = os.preadv(fd, [page], 0)
        finally:
            os.close(fd)
        return written == read == ALIGN
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


class RecordHeader:
    """What a record's lead says: ``fields`` (the JSON header) and the lead's size."""

    def __init__(self, fields: dict[str, Any], lead_bytes: int) -> None:
        self.fields = fields
        self.lead_bytes = lead_bytes


class RecordFiles:
    """Writes and reads records of ``payload_bytes`` payload bytes for store ``store`` in
    ``folder``, with ``O_DIRECT`` when ``direct``. Thread-safe (per-thread lead buffers)."""

    def __init__(self, folder: Path, store: str, payload_bytes: int, direct: bool) -> None:
        self.folder = folder
        self.store = store
        self.payload_bytes = payload_bytes
        self.padded_bytes = aligned(payload_bytes)
        self.direct = direct
        self._local = threading.local()

    def file_bytes(self, lead_bytes: int) -> int:
        return lead_bytes + self.padded_bytes

    def write(self, path: Path, fields: dict[str, Any], payload: np.ndarray) -> int:
        """Write a record with header ``fields`` and ``payload`` (``padded_bytes`` uint8, zero
        past ``payload_bytes``; page-aligned for ``O_DIRECT``) to a temporary file, then rename
        it to ``path`` (a crash leaves the old state or the whole record). Returns the lead's
        size. OSError when the disk fails (the temporary file is removed)."""
        fields = {**fields, "store": self.store, "payload": self.payload_bytes,
                  "check": xxhash.xxh3_64_intdigest(payload)}  # fmt: skip
        header = json.dumps(fields, default=list).encode()
        lead_bytes = aligned(len(MAGIC) + _LEAD.size + len(header))
        lead = self._lead_buffer(lead_bytes)
        lead[:] = 0
        lead[: len(MAGIC)] = np.frombuffer(MAGIC, dtype=np.uint8)
        start = len(MAGIC) + _LEAD.size
        lead[len(MAGIC) : start] = np.frombuffer(
            _LEAD.pack(len(header), xxhash.xxh3_64_intdigest(header)), dtype=np.uint8
        )
        lead[start : start + len(header)] = np.frombuffer(header, dtype=np.uint8)
        tmp = self.folder / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if self.direct else 0)
        try:
            fd = os.open(tmp, flags, 0o600)
            try:
                written = os.pwritev(fd, [lead, payload], 0)
            finally:
                os.close(fd)
            if written != lead_bytes + self.padded_bytes:
                raise OSError(f"short write: {written} of {lead_bytes + self.padded_bytes}")
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        return lead_bytes

    def read_header(self, path: Path) -> tuple[RecordHeader, int]:
        """The checked lead of the record at ``path`` and the file's size (through the page
        cache: a start reads every lead once). ValueError when it is not a whole record of
        this store."""
        with open(path, "rb") as f:
            first = f.read(len(MAGIC) + _LEAD.size)
            if len(first) < len(MAGIC) + _LEAD.size or not first.startswith(MAGIC):
                raise ValueError("not a record of this format (bad magic or too short)")
            length, check = _LEAD.unpack_from(first, len(MAGIC))
            header = f.read(length)
            size = f.seek(0, os.SEEK_END)
        fields = self._parse(header, length, check)
        lead_bytes = aligned(len(MAGIC) + _LEAD.size + length)
        if size != self.file_bytes(lead_bytes):
            raise ValueError("torn: not the size its header says")
        return RecordHeader(fields, lead_bytes), size

    def read(self, path: Path, lead_bytes: int, size: int, out: np.ndarray) -> dict[str, Any]:
        """Read the record at ``path`` (its lead ``lead_bytes``, the file ``size`` bytes, as
        indexed) with its payload into ``out`` (``padded_bytes`` uint8, page-aligned for
        ``O_DIRECT``); returns the checked header. ValueError when a check fails."""
        if size != self.file_bytes(lead_bytes) or out.nbytes != self.padded_bytes:
            raise ValueError("not the size it had when indexed")
        lead = self._lead_buffer(lead_bytes)
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if self.direct else 0))
        try:
            read = os.preadv(fd, [lead, out], 0)
        finally:
            os.close(fd)
        if read != size:
            raise ValueError(f"torn: read {read} bytes of {size}")
        if bytes(lead[: len(MAGIC)]) != MAGIC:
            raise ValueError("not a record of this format (bad magic)")
        length, check = _LEAD.unpack_from(lead, len(MAGIC))
        start = len(MAGIC) + _LEAD.size
        if start + length > lead_bytes:
            raise ValueError("header longer than its lead")
        fields = self._parse(lead[start : start + length].tobytes(), length, check)
        if xxhash.xxh3_64_intdigest(out) != fields["check"]:
            raise ValueError("payload checksum mismatch (torn or corrupt)")
        return fields

    def _parse(self, header: bytes, length: int, check: int) -> dict[str, Any]:
        if len(header) != length or xxhash.xxh3_64_intdigest(header) != check:
            raise ValueError("header checksum mismatch (torn or corrupt)")
        fields = json.loads(header)
        if fields.get("store") != self.store:
            raise ValueError("written by another model, dtype or block size")
        if fields.get("payload") != self.payload_bytes:
            raise ValueError("payload size mismatch")
        return fields

    def _lead_buffer(self, nbytes: int) -> np.ndarray:  # [nbytes] uint8, page-aligned
        """This thread's aligned buffer for a lead of ``nbytes`` (grown as needed)."""
        buffer = getattr(self._local, "lead", None)
        if buffer is None or buffer.nbytes < nbytes:
            buffer = aligned_array(1, aligned(nbytes))[0]
            self._local.lead = buffer
        return buffer[:nbytes]


def is_temporary(path: Path) -> bool:
    return path.name.startswith(_TMP_PREFIX)
