"""``cache_control`` TTL pins and OpenAI's prompt-cache fields through a live server: a marked
prefix survives a pool under pressure until its TTL passes (the engine's clock is moved, no
sleeping), usage reports what a request wrote, a tenant cannot pin past its budget, and
malformed markers are 400s."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from integration_helpers import SERVED_NAME, assert_openai_error, make_llm

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.integrations.server import BackgroundServer, build_app

SYSTEM = " ".join(f"rule{i}" for i in range(10))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served(tiny_chat_dir: Path) -> Iterator[tuple[str, AsyncLLM, Clock]]:
    llm = make_llm(tiny_chat_dir, num_blocks=128)  # 512 tokens; TTL pins: 32 blocks
    clock = Clock()
    llm.ttl_pins.clock = clock
    engine = AsyncLLM(llm)
    try:
        with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as server:
            yield server.base_url, engine, clock
    finally:
        engine.shutdown()


def chat(base: str, user: str, system_mark: dict | None = None, **extra) -> httpx.Response:
    system = {"role": "system", "content": SYSTEM}
    if system_mark is not None:
        system["cache_control"] = system_mark
    body = {"model": SERVED_NAME, "max_tokens": 2, "temperature": 0,
            "messages": [system, {"role": "user", "content": user}], **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)


def push_out(base: str) -> None:
    """Requests that need the whole pool: everything evictable goes."""
    for k in range(3):
        prompt = " ".join(f"noise{k}x{i}" for i in range(25))
        body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 2}
        assert httpx.post(f"{base}/v1/completions", json=body, timeout=30).status_code == 200


def test_a_marked_prefix_survives_until_its_ttl_passes(served) -> None:
    base, _, clock = served
    first = chat(base, "first", {"type": "ephemeral", "ttl": "5m"})
    assert first.status_code == 200, first.text
    usage = first.json()["usage"]
    assert usage["cache_creation_input_tokens"] > 0
    stats = httpx.get(f"{base}/v1/cache/stats").json()
    assert stats["ttl_pins"] == 1 and stats["ttl_pinned_blocks"] > 0
    push_out(base)
    again = chat(base, "second").json()["usage"]
    pinned = usage["cache_creation_input_tokens"]
    assert again["prompt_tokens_details"]["cached_tokens"] >= pinned - 4  # a block rounding
    assert again["cache_creation_input_tokens"] == 0  # no marker this time
    clock.now += 301  # past 5 minutes: the next step lets it go
    push_out(base)
    assert httpx.get(f"{base}/v1/cache/stats").json()["ttl_pins"] == 0
    gone = chat(base, "third").json()["usage"]
    assert gone["prompt_tokens_details"]["cached_tokens"] < usage["cache_creation_input_tokens"]
    assert httpx.get(f"{base}/v1/cache/stats").json()["in_use"] == 0


def test_retention_pins_the_whole_prompt_and_the_budget_holds(served) -> None:
    base, engine, clock = served
    pins = engine.llm.ttl_pins
    pins.budget_blocks = 64
    kept = chat(base, "keep all of this", prompt_cache_retention="24h",
                prompt_cache_key="session-7")
    assert kept.status_code == 200, kept.text
    held = httpx.get(f"{base}/v1/cache/stats").json()["ttl_pinned_blocks"]
    assert held * 4 >= kept.json()["usage"]["prompt_tokens"] - 4  # the whole prompt
    assert chat(base, "nothing kept", prompt_cache_retention="in_memory").status_code == 200
    assert httpx.get(f"{base}/v1/cache/stats").json()["ttl_pins"] == 1
    pins.budget_blocks = held + 2  # room for 2 more blocks per tenant
    too_much = chat(base, "more", {"type": "ephemeral", "ttl": "1h"})
    assert_openai_error(too_much, 429, None, "pin_budget_exceeded")
    other = chat(base, "more", {"type": "ephemeral", "ttl": "1h"}, cache_salt="tenant-b")
    assert other.status_code == 200, other.text  # another tenant: a budget of its own
    clock.now += 86401
    push_out(base)
    assert httpx.get(f"{base}/v1/cache/stats").json()["ttl_pins"] == 0


@pytest.mark.parametrize("mark", [{"type": "persistent"}, {"type": "ephemeral", "ttl": "2h"},
                                  "yes"])  # fmt: skip
def test_a_malformed_marker_is_a_400(served, mark) -> None:
    base, _, _ = served
    assert_openai_error(chat(base, "x", mark), 400, "messages")


def test_a_bad_retention_is_a_400(served) -> None:
    base, _, _ = served
    assert_openai_error(chat(base, "x", prompt_cache_retention="forever"), 400,
                        "prompt_cache_retention")  # fmt: skip
