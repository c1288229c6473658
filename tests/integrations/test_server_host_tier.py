"""`prefixcache serve` with a host-memory KV tier: an evicted prompt comes back as a tier hit,
visible in /v1/cache/stats and /metrics; the answer is the one the prompt got first."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from integration_helpers import SERVED_NAME, counter_value

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.engine.llm import LLM
from prefixcache.integrations.server import BackgroundServer, build_app

DOCUMENT = " ".join(f"word{i % 37}" for i in range(20))


def complete(client: httpx.Client, base: str, prompt: str) -> str:
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 6, "temperature": 0}
    response = client.post(f"{base}/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


@contextmanager
def tiered_server(folder: Path) -> Iterator[tuple[httpx.Client, str]]:
    """A live server on an engine with a 48-block pool and a 2 MiB host tier."""
    llm = LLM(str(folder), dtype="float32", num_blocks=48, block_size=4, kv_host_memory="2MiB")
    engine = AsyncLLM(llm)
    try:
        with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as server, \
                httpx.Client(timeout=60) as client:  # fmt: skip
            yield client, server.base_url
    finally:
        engine.shutdown()


def test_an_evicted_prompt_is_served_from_the_tier(tiny_chat_dir: Path) -> None:
    with tiered_server(tiny_chat_dir) as (client, base):
        first = complete(client, base, DOCUMENT + " question one")
        for k in range(3):  # other documents push it out of the 48-block pool
            complete(client, base, " ".join(f"other{k}x{i}" for i in range(20)))
        again = complete(client, base, DOCUMENT + " question one")
        stats = client.get(f"{base}/v1/cache/stats").json()
        metrics = client.get(f"{base}/metrics").text
    assert again == first
    assert stats["host_tier_hit_tokens"] > 0 and stats["host_tier_blocks"] > 0
    assert stats["in_use"] == 0
    hits = counter_value(metrics, "prefixcache_host_tier_hits_tokens_total ")
    assert hits == stats["host_tier_hit_tokens"]
    assert counter_value(metrics, "prefixcache_host_tier_capacity_blocks ") == stats[
        "host_tier_slots"
    ]
    # latency histograms of the copies, in /v1/cache/stats and /metrics alike
    host = stats["tier_latency_seconds"]["host"]
    assert host["load"]["count"] >= 1 and host["store"]["count"] >= 1
    assert host["load"]["blocks"] * 4 == stats["host_tier_hit_tokens"]
    assert host["store"]["blocks"] == stats["host_tier_writebacks"]
    loads = counter_value(metrics, 'prefixcache_kv_tier_load_seconds_count{tier="host"} ')
    assert loads == host["load"]["count"]
    inf = 'prefixcache_kv_tier_store_seconds_bucket{le="+Inf",tier="host"} '
    every = counter_value(metrics, inf)
    assert every == host["store"]["count"]


def test_reset_empties_the_tier_unless_told_to_keep_it(tiny_chat_dir: Path) -> None:
    with tiered_server(tiny_chat_dir) as (client, base):
        for k in range(4):
            complete(client, base, " ".join(f"doc{k}w{i}" for i in range(20)))
        held = client.get(f"{base}/v1/cache/stats").json()["host_tier_blocks"]
        kept = client.post(f"{base}/v1/cache/reset", params={"host_tier": "false"})
        after_keep = client.get(f"{base}/v1/cache/stats").json()
        emptied = client.post(f"{base}/v1/cache/reset")
        after_empty = client.get(f"{base}/v1/cache/stats").json()
        bad = client.post(f"{base}/v1/cache/reset", params={"host_tier": "maybe"})
    assert held > 0 and kept.status_code == emptied.status_code == 200
    assert after_keep["host_tier_blocks"] == held and after_keep["cached"] == 0
    assert after_empty["host_tier_blocks"] == 0
    assert bad.status_code == 400
