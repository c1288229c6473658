"""trace: replay a JSONL file, one request per line (the format ``--save-requests`` writes).

Each line is an object with
* ``prompt_token_ids`` (list of ints), or ``input_length`` (int) with optional ``hash_ids``
  (list of ints, Mooncake-style: id h stands for a fixed block of ``HASH_BLOCK_TOKENS``
  seeded tokens, so equal ids give equal prefixes; random tokens pad to ``input_length``);
* ``max_tokens`` or ``output_length`` (int > 0);
* optional ``timestamp`` (seconds from the start, non-decreasing), ``request_id``,
  ``workload``, ``group``.
A bad line raises ``TraceError`` naming the file and the 1-based line number.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from prefixcache.integrations.bench.bench_request import BenchRequest
from prefixcache.integrations.bench.token_source import TokenRange

HASH_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the line."""


def load_trace(path: Path, seed: int, tokens: TokenRange) -> list[BenchRequest]:
    """The requests of ``path`` in file order; blank lines are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise TraceError(f"{path}: cannot read ({error.strerror or error})") from None
    blocks: dict[int, tuple[int, ...]] = {}
    requests: list[BenchRequest] = []
    last_timestamp = float("-inf")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            request = _parse_line(line, number, seed, tokens, blocks)
        except (ValueError, TypeError) as error:
            raise TraceError(f"{path} line {number}: {error}") from None
        if request.timestamp is not None:
            if request.timestamp < last_timestamp:
                raise TraceError(f"{path} line {number}: timestamp goes backwards")
            last_timestamp = request.timestamp
        requests.append(request)
    if not requests:
        raise TraceError(f"{path}: no requests")
    if len({r.request_id for r in requests}) != len(requests):
        raise TraceError(f"{path}: request ids are not unique")
    timed = sum(r.timestamp is not None for r in requests)
    if 0 < timed < len(requests):
        raise TraceError(f"{path}: either every line has a timestamp or none does")
    return requests


def _parse_line(
    line: str, number: int, seed: int, tokens: TokenRange, blocks: dict[int, tuple[int, ...]]
) -> BenchRequest:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error.msg})") from None
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    if "prompt_token_ids" in record:
        prompt = record["prompt_token_ids"]
        if not isinstance(prompt, list) or not prompt or not all(_is_int(t) for t in prompt):
            raise ValueError("prompt_token_ids must be a non-empty list of ints")
        if any(t < 0 for t in prompt):
            raise ValueError("prompt_token_ids must be >= 0")
        prompt_ids = tuple(prompt)
    elif "input_length" in record:
        prompt_ids = _synthetic_prompt(record, number, seed, tokens, blocks)
    else:
        raise ValueError("needs prompt_token_ids or input_length")
    max_tokens = record.get("max_tokens", record.get("output_length"))
    if not _is_int(max_tokens) or max_tokens <= 0:
        raise ValueError("max_tokens (or output_length) must be a positive int")
    timestamp = record.get("timestamp")
    if timestamp is not None and (
        isinstance(timestamp, bool) or not isinstance(timestamp, int | float) or timestamp < 0
    ):
        raise ValueError("timestamp must be a number >= 0 (seconds)")
    return BenchRequest(
        request_id=str(record.get("request_id", f"trace-{number}")),
        prompt_token_ids=prompt_ids,
        max_tokens=max_tokens,
        workload=str(record.get("workload", "trace")),
        group=str(record.get("group", "")),
        timestamp=None if timestamp is None else float(timestamp),
    )


def _synthetic_prompt(
    record: dict[str, Any],
    number: int,
    seed: int,
    tokens: TokenRange,
    blocks: dict[int, tuple[int, ...]],
) -> tuple[int, ...]:
    length = record["input_length"]
    if not _is_int(length) or length <= 0:
        raise ValueError("input_length must be a positive int")
    hash_ids = record.get("hash_ids", [])
    if not isinstance(hash_ids, list) or not all(_is_int(h) and h >= 0 for h in hash_ids):
        raise ValueError("hash_ids must be a list of ints >= 0")
    prompt: tuple[int, ...] = ()
    for hash_id in hash_ids:
        if hash_id not in blocks:
            blocks[hash_id] = tokens.draw(
                np.random.default_rng([seed, 5, hash_id]), HASH_BLOCK_TOKENS
            )
        prompt += blocks[hash_id]
    if len(prompt) < length:
        prompt += tokens.draw(np.random.default_rng([seed, 6, number]), length - len(prompt))
    return prompt[:length]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
