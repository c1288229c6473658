"""Cache control routes and tenant isolation by cache salt (body field or header)."""

from __future__ import annotations

import httpx
import pytest
from integration_helpers import SERVED_NAME, assert_server_clean, cache_stats

from prefixcache.integrations.server import BackgroundServer

DOCUMENT = "the quick brown fox jumps over the lazy dog; " * 4


@pytest.fixture()
def http(server: BackgroundServer):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        client.post("/v1/cache/reset").raise_for_status()
        yield client
    assert_server_clean(server.base_url)


def lookup(http: httpx.Client, prompt: str, salt: str | None = None, **headers: str) -> int:
    body = {"prompt": prompt} if salt is None else {"prompt": prompt, "cache_salt": salt}
    response = http.post("/v1/cache/lookup", json=body, headers=headers)
    response.raise_for_status()
    return response.json()["cached_tokens"]


def test_warm_then_completion_hits(http: httpx.Client) -> None:
    warmed = http.post("/v1/cache/warm", json={"prompt": DOCUMENT}).json()
    assert warmed["cached_tokens"] == warmed["prompt_tokens"] > 0  # to its last token
    assert lookup(http, DOCUMENT) == warmed["cached_tokens"]
    completion = http.post("/v1/completions", json={
        "model": SERVED_NAME, "prompt": DOCUMENT + " and more", "max_tokens": 2}).json()
    assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] >= \
        warmed["cached_tokens"] - 4


def test_pin_survives_reset_until_unpinned(http: httpx.Client) -> None:
    warmed = http.post("/v1/cache/warm", json={"prompt": DOCUMENT, "pin": True}).json()
    assert warmed["pinned"] and cache_stats(http.base_url)["pinned_nodes"] == 1
    http.post("/v1/cache/reset").raise_for_status()
    assert lookup(http, DOCUMENT) == warmed["cached_tokens"]
    assert http.post("/v1/cache/unpin", json={"prompt": DOCUMENT}).json()["unpinned"]
    assert http.post("/v1/cache/reset").json()["evicted_blocks"] > 0
    assert lookup(http, DOCUMENT) == 0


def test_pin_route_pins_what_is_cached(http: httpx.Client) -> None:
    assert http.post("/v1/cache/pin", json={"prompt": DOCUMENT}).json()["pinned_tokens"] == 0
    http.post("/v1/cache/warm", json={"prompt": DOCUMENT}).raise_for_status()
    pinned = http.post("/v1/cache/pin", json={"prompt": DOCUMENT}).json()["pinned_tokens"]
    assert pinned == lookup(http, DOCUMENT) > 0
    http.post("/v1/cache/unpin", json={"prompt": DOCUMENT}).raise_for_status()


def test_warm_chat_messages_prefix(http: httpx.Client) -> None:
    messages = [{"role": "system", "content": DOCUMENT}]
    warmed = http.post("/v1/cache/warm", json={"messages": messages}).json()
    chat = http.post("/v1/chat/completions", json={
        "model": SERVED_NAME, "max_tokens": 1,
        "messages": [*messages, {"role": "user", "content": "summarize"}]}).json()
    assert chat["usage"]["prompt_tokens_details"]["cached_tokens"] >= \
        warmed["cached_tokens"] - 8 > 0


def test_tenants_do_not_share_cache(http: httpx.Client) -> None:
    http.post("/v1/cache/warm", json={"prompt": DOCUMENT, "cache_salt": "tenant-a"})
    assert lookup(http, DOCUMENT, "tenant-a") > 0
    assert lookup(http, DOCUMENT, "tenant-b") == 0 and lookup(http, DOCUMENT) == 0
    assert lookup(http, DOCUMENT, **{"X-Cache-Salt": "tenant-a"}) > 0
    body = {"model": SERVED_NAME, "prompt": DOCUMENT, "max_tokens": 1}
    other = http.post("/v1/completions", json={**body, "cache_salt": "tenant-b"}).json()
    same = http.post("/v1/completions", json=body, headers={"X-Cache-Salt": "tenant-a"}).json()
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert same["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_stats_counts_hits(http: httpx.Client) -> None:
    before = cache_stats(http.base_url)
    http.post("/v1/cache/warm", json={"prompt": DOCUMENT}).raise_for_status()
    http.post("/v1/completions", json={"model": SERVED_NAME, "prompt": DOCUMENT,
                                       "max_tokens": 1}).raise_for_status()
    after = cache_stats(http.base_url)
    assert after["hit_tokens"] > before["hit_tokens"]
    assert after["finished_requests"] == before["finished_requests"] + 2
