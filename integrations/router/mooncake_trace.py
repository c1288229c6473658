"""Mooncake-format request traces: one JSON object a line with ``timestamp`` (milliseconds),
``input_length``, ``output_length`` and ``hash_ids`` (one id per 512-token block; equal ids at
equal positions are a shared prefix, the last block may be partly filled)."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512


class TraceFormatError(ValueError):
    """A trace line that is not a Mooncake record; the message names the file and line."""


@dataclass(frozen=True)
class TraceRequest:
    """One request: ``blocks`` are the ids of its *full* blocks (the cacheable prefix)."""

    arrival_s: float
    input_length: int
    output_length: int
    blocks: np.ndarray  # [input_length // block_tokens] int32


def load_mooncake(
    path: Path, limit: int | None = None, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> list[TraceRequest]:
    """The first ``limit`` requests of ``path`` (plain or ``.gz``; all when None) in arrival
    order. A file that cannot be read or a bad line raises TraceFormatError naming it."""
    path = Path(path)
    requests: list[TraceRequest] = []
    try:
        with _open_text(path) as handle:
            for number, line in enumerate(handle, start=1):
                if limit is not None and len(requests) >= limit:
                    break
                if line.strip():
                    requests.append(_parse_line(path, number, line, block_tokens))
    except (OSError, EOFError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise TraceFormatError(f"{path}: cannot read ({reason})") from None
    if not requests:
        raise TraceFormatError(f"{path}: no requests")
    requests.sort(key=lambda r: r.arrival_s)
    return requests


def _open_text(path: Path) -> TextIO:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def _parse_line(path: Path, number: int, line: str, block_tokens: int) -> TraceRequest:
    try:
        return _parse(line, block_tokens)
    except (ValueError, TypeError, KeyError) as error:
        raise TraceFormatError(f"{path} line {number}: {error}") from None


def _parse(line: str, block_tokens: int) -> TraceRequest:
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    for field in ("timestamp", "input_length", "output_length", "hash_ids"):
        if field not in record:
            raise ValueError(f"missing {field!r}")
    timestamp, length, output = record["timestamp"], record["input_length"], record["output_length"]
    if not _is_number(timestamp) or timestamp < 0:
        raise ValueError("timestamp must be a number >= 0 (milliseconds)")
    if not _is_int(length) or length < 1 or not _is_int(output) or output < 0:
        raise ValueError("input_length must be an int >= 1 and output_length an int >= 0")
    ids = record["hash_ids"]
    if not isinstance(ids, list) or not all(_is_int(i) and 0 <= i < 2**31 for i in ids):
        raise ValueError("hash_ids must be a list of ints in [0, 2**31)")
    if len(ids) < length // block_tokens:
        raise ValueError(f"{len(ids)} hash_ids cannot cover {length} tokens")
    blocks = np.asarray(ids[: length // block_tokens], dtype=np.int32)
    return TraceRequest(timestamp / 1000.0, length, output, blocks)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
