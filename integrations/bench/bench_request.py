"""One benchmark request, token-exact, and the JSONL request-list format it reads and writes.

A request list written by ``write_request_list`` replays exactly with ``--workload trace``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BenchRequest:
    """A prompt as token ids plus how many tokens to generate (EOS ignored, so exact).

    ``timestamp``: seconds after the run starts at which to send it (trace replay), or None.
    ``group``: what the prompt shares a prefix with (a system prompt, a session), for reports.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    workload: str
    group: str = ""
    timestamp: float | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    def to_json(self) -> dict:
        record: dict = {
            "request_id": self.request_id,
            "workload": self.workload,
            "group": self.group,
            "max_tokens": self.max_tokens,
            "prompt_token_ids": list(self.prompt_token_ids),
        }
        if self.timestamp is not None:
            record["timestamp"] = self.timestamp
        return record


def write_request_list(requests: Iterable[BenchRequest], path: Path) -> Path:
    """Write one JSON object per line (the trace format); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for request in requests:
            handle.write(json.dumps(request.to_json(), separators=(",", ":")) + "\n")
    return path


def interleave(*request_lists: list[BenchRequest]) -> list[BenchRequest]:
    """Round-robin merge that keeps each list's own order (agent turns stay in sequence)."""
    merged: list[BenchRequest] = []
    longest = max((len(items) for items in request_lists), default=0)
    for index in range(longest):
        merged.extend(items[index] for items in request_lists if index < len(items))
    return merged
