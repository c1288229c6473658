"""Helpers for the integration tests: the tiny chat model's engine, leak checks, live-server
calls. (A uniquely named module: ``conftest`` names clash across test folders.)"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from prefixcache.engine.llm import LLM

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SERVED_NAME = "tiny-llama"
CLI = [sys.executable, "-m", "prefixcache.integrations.cli"]  # `prefixcache` in a subprocess


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def make_llm(folder: Path, num_blocks: int = 256, block_size: int = 4) -> LLM:
    return LLM(str(folder), dtype="float32", num_blocks=num_blocks, block_size=block_size)


def assert_no_leak(llm: LLM) -> None:
    """No block held by a request, no request left, cache structure intact."""
    llm.cache.check_invariants()
    stats = llm.stats()
    assert stats["in_use"] == 0 and stats["running"] == 0 and stats["waiting"] == 0, stats


def cache_stats(base_url: str, **headers: str) -> dict[str, Any]:
    """``GET /v1/cache/stats`` (the server checks the cache invariants before answering)."""
    response = httpx.get(f"{base_url}/v1/cache/stats", headers=headers, timeout=30)
    response.raise_for_status()
    return response.json()


def assert_server_clean(base_url: str, **headers: str) -> dict[str, Any]:
    stats = cache_stats(base_url, **headers)
    assert stats["in_use"] == 0 and stats["running"] == 0 and stats["waiting"] == 0, stats
    return stats


def wait_until_clean(base_url: str, deadline_s: float = 20.0) -> dict[str, Any]:
    """Poll until no request holds blocks (a disconnect is noticed asynchronously)."""
    end = time.monotonic() + deadline_s
    while True:
        stats = cache_stats(base_url)
        if stats["in_use"] == 0 and stats["running"] == 0 and stats["waiting"] == 0:
            return stats
        if time.monotonic() > end:
            raise AssertionError(f"blocks still held after {deadline_s}s: {stats}")
        time.sleep(0.05)


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None,
                        code: str | None = None) -> dict[str, Any]:
    """The response is ``status`` with an OpenAI-style error body."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def counter_value(metrics_text: str, line_prefix: str) -> float:
    """The value of the first exposition line starting with ``line_prefix`` (0 if absent)."""
    for line in metrics_text.splitlines():
        if line.startswith(line_prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def discriminating_stop(text: str) -> str:
    """A two-character stop string of ``text`` one of whose characters occurs earlier: cut at
    the string, ``text`` keeps more than cut at any single character of it."""
    for k in range(1, len(text) - 1):
        stop = text[k:k + 2]
        if "\ufffd" not in stop and text.index(stop) == k and any(c in text[:k] for c in stop):
            return stop
    raise AssertionError(f"no discriminating stop string in {text!r}")
