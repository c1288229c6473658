"""The shared KV tier in a real Redis (a ``redis-server`` this test starts on a free port):
what one replica computed another loads, bitwise as uncached; salts stay apart; a corrupt
value is a miss; a store that dies mid-run costs misses, never an error or a hang."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from step_logits import record_step_logits

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.integrations.server.server_process import free_port

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
DOCS = [[(11 * i + 7 * k) % 290 + 3 for i in range(64)] for k in range(3)]
QUESTION = [7, 8, 9]

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server is not installed")  # fmt: skip


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    import redis

    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    end = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert process.poll() is None and time.monotonic() < end, "redis-server did not start"
            time.sleep(0.05)
    yield url, process
    process.kill()
    process.wait()


def engine(folder: Path, remote: str | None, **kwargs) -> LLM:
    return LLM(str(folder), dtype="float32", num_blocks=64, block_size=4, kv_remote=remote,
               **kwargs)  # fmt: skip


def answers(llm: LLM, salt: str | None = None) -> tuple[list[list[int]], list[torch.Tensor]]:
    logits = record_step_logits(llm)
    tokens = [llm.generate([doc + QUESTION], GREEDY, salt=salt)[0].token_ids for doc in DOCS]
    return tokens, logits


def test_a_replica_loads_what_another_computed(tiny_llama_dir: Path, redis_server) -> None:
    url, _ = redis_server
    expected, expected_logits = answers(engine(tiny_llama_dir, None,
                                               enable_prefix_caching=False))  # fmt: skip
    replica_a = engine(tiny_llama_dir, url)
    answers(replica_a)
    replica_a.flush_tiers()
    assert replica_a.stats()["remote_tier_written"] >= 3 * 16
    replica_b = engine(tiny_llama_dir, url)
    got, got_logits = answers(replica_b)
    assert got == expected
    assert all(torch.equal(a, b) for a, b in zip(got_logits, expected_logits, strict=True))
    stats = replica_b.stats()
    assert stats["remote_tier_hit_tokens"] >= 3 * 64 - 4 and stats["remote_tier_errors"] == 0
    replica_b.cache.check_invariants()
    salted = engine(tiny_llama_dir, url)
    answers(salted, salt="another-tenant")
    assert salted.stats()["remote_tier_hit_tokens"] == 0


def test_a_corrupt_value_is_a_miss(tiny_llama_dir: Path, redis_server) -> None:
    import redis

    url, _ = redis_server
    expected, _ = answers(engine(tiny_llama_dir, None, enable_prefix_caching=False))
    replica_a = engine(tiny_llama_dir, url)
    answers(replica_a)
    replica_a.flush_tiers()
    client = redis.Redis.from_url(url)
    for key in client.scan_iter("pckv:*:p"):
        value = bytearray(client.get(key))
        value[5] ^= 0xFF
        client.set(key, bytes(value))
    replica_b = engine(tiny_llama_dir, url)
    got, _ = answers(replica_b)
    assert got == expected
    stats = replica_b.stats()
    assert stats["remote_tier_hit_tokens"] == 0 and stats["remote_tier_corrupt"] >= 3


def test_a_store_that_dies_costs_misses_only(tiny_llama_dir: Path, redis_server) -> None:
    url, process = redis_server
    expected, _ = answers(engine(tiny_llama_dir, None, enable_prefix_caching=False))
    llm = engine(tiny_llama_dir, url, kv_host_memory=None)
    llm.generate([DOCS[0] + QUESTION], GREEDY)
    process.kill()
    process.wait()
    start = time.monotonic()
    got, _ = answers(llm)
    llm.flush_tiers()
    assert got == expected
    assert time.monotonic() - start < 30  # timeouts and a back-off, not a hang per block
    stats = llm.stats()
    assert stats["remote_tier_errors"] >= 1 and stats["in_use"] == 0
    llm.cache.check_invariants()


def test_a_bad_remote_url_is_refused(tiny_llama_dir: Path) -> None:
    with pytest.raises(ValueError, match="kv_remote"):
        engine(tiny_llama_dir, "http://not-redis")
    with pytest.raises(TypeError, match="kv_remote"):
        engine(tiny_llama_dir, 6379)
