"""KV events out of a live server: a subscriber's index equals the server's cache, through
late joins (replay from 0), missed batches, a reset, and a server that publishes none."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from integration_helpers import SERVED_NAME, make_llm
from typer.testing import CliRunner

from prefixcache.cluster_index import ClusterIndex
from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.engine.llm import LLM
from prefixcache.integrations.cli import build_app as build_cli
from prefixcache.integrations.router.kv_event_subscriber import KVEventSubscriber
from prefixcache.integrations.server import BackgroundServer, build_app

BS = 4
PROMPTS = [[5 + i % 7 for i in range(n)] for n in (9, 13, 21)] + [[30, 31, 32, 33] * 5]


@pytest.fixture(scope="module")
def published(tiny_chat_dir: Path) -> Iterator[tuple[AsyncLLM, BackgroundServer]]:
    llm = LLM(str(tiny_chat_dir), dtype="float32", num_blocks=24, block_size=BS,
              kv_events="tcp://127.0.0.1:*", kv_events_replay="tcp://127.0.0.1:*")  # fmt: skip
    engine = AsyncLLM(llm)
    try:
        with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as running:
            yield engine, running
    finally:
        engine.shutdown()


async def complete(client: httpx.AsyncClient, prompt: list[int]) -> None:
    response = await client.post("/v1/completions", json={
        "model": SERVED_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0})  # fmt: skip
    response.raise_for_status()


async def until_index_matches(engine: AsyncLLM, index: ClusterIndex, prompts) -> None:
    """Wait (at most 10 s) until the index agrees with the server's cache on every prompt."""
    deadline = time.monotonic() + 10

    def agrees() -> bool:
        return all(index.match(index.prompt_hashes(p)).get("a", 0) * BS
                   == engine.llm.cache.lookup(p) for p in prompts)  # fmt: skip

    while not agrees():
        assert time.monotonic() < deadline, "the index never caught up with the cache"
        await asyncio.sleep(0.02)
    index.check_invariants()


def test_a_subscriber_mirrors_the_cache(published) -> None:
    engine, server = published
    info = httpx.get(f"{server.base_url}/kv_events").json()
    assert info["block_size"] == BS and info["format"] == "vllm-kv-events"
    assert info["endpoint"].startswith("tcp://127.0.0.1:") and info["replay_endpoint"]

    async def scenario() -> None:
        early_index, late_index = ClusterIndex(BS), ClusterIndex(BS)
        early = KVEventSubscriber("a", early_index, info["endpoint"], info["replay_endpoint"])
        early.start()
        await early.connected.wait()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            for prompt in PROMPTS[:3]:
                await complete(client, prompt)
            await until_index_matches(engine, early_index, PROMPTS)
            assert early_index.num_blocks("a") > 0
            # a router that starts now learns what was cached before, by replay from 0
            late = KVEventSubscriber("a", late_index, info["endpoint"], info["replay_endpoint"])
            late.start()
            await late.connected.wait()
            await complete(client, PROMPTS[3])  # the pool of 24 blocks evicts some
            await until_index_matches(engine, early_index, PROMPTS)
            await until_index_matches(engine, late_index, PROMPTS)
            assert late.replayed_batches > 0 and late_index.orphan_blocks == 0
            (await client.post("/v1/cache/reset", json={})).raise_for_status()
            await until_index_matches(engine, early_index, PROMPTS)
            assert early_index.num_blocks("a") == 0
        await early.stop()
        await late.stop()

    asyncio.run(scenario())


def test_missed_batches_are_replayed_and_restarts_clear(published) -> None:
    engine, server = published
    info = httpx.get(f"{server.base_url}/kv_events").json()

    async def scenario() -> None:
        index = ClusterIndex(BS)
        subscriber = KVEventSubscriber("a", index, info["endpoint"], info["replay_endpoint"])
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            for prompt in PROMPTS[:2]:
                await complete(client, prompt)
        # fed by hand: only the newest batch arrives, everything before it is replayed
        publisher = engine.llm.kv_events
        assert publisher is not None and publisher.wait_sent()
        newest_seq, payload = publisher._sent[-1]
        await subscriber.receive(newest_seq, payload)
        assert subscriber.replayed_batches == newest_seq
        await until_index_matches(engine, index, PROMPTS)
        await subscriber.receive(0, publisher._sent[0][1])  # the backend restarted
        assert subscriber.restarts == 1 and subscriber.last_seq == 0

    asyncio.run(scenario())


def test_a_server_without_events_answers_404(tiny_chat_dir: Path) -> None:
    engine = AsyncLLM(make_llm(tiny_chat_dir))
    try:
        with BackgroundServer(build_app(engine, model_name=SERVED_NAME)) as running:
            response = httpx.get(f"{running.base_url}/kv_events")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "kv_events_off"
    finally:
        engine.shutdown()


def test_bad_endpoints_fail_before_the_model_loads(tiny_chat_dir: Path, tmp_path: Path) -> None:
    for args, message in [
        (["--kv-events", "localhost:5557"], "not a ZeroMQ endpoint"),
        (["--kv-events-replay", "tcp://127.0.0.1:5558"], "needs --kv-events"),
    ]:
        result = CliRunner().invoke(build_cli(), ["serve", "--model", str(tmp_path), *args])
        assert result.exit_code == 2 and message in result.output, result.output
    taken = LLM(str(tiny_chat_dir), num_blocks=8, kv_events="tcp://127.0.0.1:*")
    try:
        assert taken.kv_events is not None
        with pytest.raises(ValueError, match="cannot bind"):
            LLM(str(tmp_path / "never-loaded"), kv_events=taken.kv_events.endpoint)
    finally:
        taken.close()
