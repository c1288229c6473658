"""Request lists: write, replay exactly; trace lines validated with their line number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixcache.integrations.bench.bench_request import write_request_list
from prefixcache.integrations.bench.token_source import TokenRange
from prefixcache.integrations.bench.workload_registry import build_requests
from prefixcache.integrations.bench.workload_trace import HASH_BLOCK_TOKENS, TraceError, load_trace

TOKENS = TokenRange.for_vocab(32000)


def test_written_request_list_replays_exactly(tmp_path: Path) -> None:
    requests = build_requests("agent,shared-prefix", 5, TOKENS)
    path = write_request_list(requests, tmp_path / "list.jsonl")
    assert load_trace(path, seed=999, tokens=TOKENS) == requests  # seed is irrelevant here


def test_trace_with_timestamps_and_hash_ids(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0.0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]},
        {"timestamp": 0.5, "input_length": 700, "output_length": 2, "hash_ids": [1, 3]},
        {"timestamp": 0.5, "prompt_token_ids": [5, 6, 7], "max_tokens": 1, "request_id": "x"},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    first, second, third = load_trace(path, seed=0, tokens=TOKENS)
    assert (first.prompt_len, second.prompt_len, third.prompt_len) == (600, 700, 3)
    block = HASH_BLOCK_TOKENS
    assert first.prompt_token_ids[:block] == second.prompt_token_ids[:block]  # hash id 1
    assert first.prompt_token_ids[block:600] != second.prompt_token_ids[block:600]
    assert (first.timestamp, second.timestamp, third.timestamp) == (0.0, 0.5, 0.5)
    assert (first.request_id, third.request_id, third.max_tokens) == ("trace-1", "x", 1)
    assert load_trace(path, seed=0, tokens=TOKENS) == [first, second, third]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: expected a JSON object"),
        ('{"max_tokens": 3}', "line 2: needs prompt_token_ids or input_length"),
        ('{"prompt_token_ids": [], "max_tokens": 3}', "line 2: prompt_token_ids must be"),
        ('{"prompt_token_ids": [1, "a"], "max_tokens": 3}', "line 2: prompt_token_ids must be"),
        ('{"prompt_token_ids": [1], "max_tokens": 0}', "line 2: max_tokens"),
        ('{"input_length": 4, "max_tokens": 2, "hash_ids": [-1]}', "line 2: hash_ids"),
        ('{"prompt_token_ids": [1], "max_tokens": 1, "timestamp": -3}', "line 2: timestamp"),
    ],
)
def test_bad_line_is_an_error_naming_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_token_ids": [1, 2], "max_tokens": 2}\n' + line + "\n")
    with pytest.raises(TraceError, match=message):
        load_trace(path, 0, TOKENS)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no requests"),
        (
            '{"prompt_token_ids":[1],"max_tokens":1,"timestamp":2}\n'
            '{"prompt_token_ids":[1],"max_tokens":1,"timestamp":1}\n',
            "line 2: timestamp goes back",
        ),
        (
            '{"prompt_token_ids":[1],"max_tokens":1,"timestamp":2}\n'
            '{"prompt_token_ids":[1],"max_tokens":1}\n',
            "every line has a timestamp or none",
        ),
        (
            '{"prompt_token_ids":[1],"max_tokens":1,"request_id":"a"}\n'
            '{"prompt_token_ids":[1],"max_tokens":1,"request_id":"a"}\n',
            "not unique",
        ),
    ],
)
def test_bad_trace_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        load_trace(path, 0, TOKENS)


def test_missing_trace_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "absent.jsonl", 0, TOKENS)
