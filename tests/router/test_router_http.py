"""The HTTP router over live servers: sessions land where their prefix is cached, the precise
index equals each backend's cache, streams and errors pass through unchanged."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from engine_gate import EngineGate
from tiny_model_factory import make_tiny_model_dir

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.engine.llm import LLM
from prefixcache.integrations.router.app import RouterConfig, build_router_app
from prefixcache.integrations.router.forwarding import ROUTED_TO_HEADER
from prefixcache.integrations.router.prompt_tokenizer import PromptTokenizer
from prefixcache.integrations.server import BackgroundServer, build_app

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NAME = "tiny"
BS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("router-model"), "llama",
                                 max_position_embeddings=2048)  # fmt: skip
    (folder / "chat_template.jinja").write_text(CHATML)
    return folder


@pytest.fixture(scope="module")
def cluster(model_dir: Path) -> Iterator[tuple[list[AsyncLLM], list[BackgroundServer]]]:
    """Three backends: two publish KV events (precise), one does not (approximate)."""
    engines, servers = [], []
    try:
        for events in (True, True, False):
            llm = LLM(str(model_dir), dtype="float32", num_blocks=512, block_size=BS,
                      kv_events="tcp://127.0.0.1:*" if events else None)  # fmt: skip
            engines.append(AsyncLLM(llm))
            servers.append(BackgroundServer(build_app(engines[-1], model_name=NAME)).start())
        yield engines, servers
    finally:
        for server in servers:
            server.stop()
        for engine in engines:
            engine.shutdown()


@pytest.fixture(scope="module")
def router(cluster, model_dir: Path) -> Iterator[BackgroundServer]:
    _, servers = cluster
    config = RouterConfig([s.base_url for s in servers],
                          tokenizer=PromptTokenizer.load(str(model_dir)))  # fmt: skip
    with BackgroundServer(build_router_app(config), lifespan="on") as running:
        yield running


def the_router(server: BackgroundServer):
    return server._server.config.app.state.routers["router"]


def chat(url: str, messages: list[dict], **extra) -> httpx.Response:
    body = {"model": NAME, "messages": messages, "max_tokens": 3, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def test_backends_join_with_the_right_index(router, cluster) -> None:
    stats = httpx.get(f"{router.base_url}/router/stats").json()
    assert [b["index"] for b in stats["backends"]] == ["precise", "precise", "approximate"]
    assert all(b["healthy"] for b in stats["backends"])
    assert httpx.get(f"{router.base_url}/health").json()["healthy_backends"] == 3
    models = httpx.get(f"{router.base_url}/v1/models").json()
    assert models["data"][0]["id"] == NAME


def test_each_session_stays_where_its_prefix_is_cached(router, cluster) -> None:
    engines, _servers = cluster
    landed: dict[int, set[str]] = {}
    cached_later = []
    for turn in range(3):
        for session in range(6):
            history = [{"role": "system", "content": f"session {session} " + "rules " * 40}]
            for past in range(turn + 1):
                history += [{"role": "user", "content": f"question {past} of {session}"}]
            response = chat(router.base_url, history)
            assert response.status_code == 200, response.text
            landed.setdefault(session, set()).add(response.headers[ROUTED_TO_HEADER])
            if turn:
                usage = response.json()["usage"]
                cached_later.append(usage["prompt_tokens_details"]["cached_tokens"]
                                    / usage["prompt_tokens"])  # fmt: skip
    assert all(len(backends) == 1 for backends in landed.values()), landed
    assert len(set().union(*landed.values())) >= 2  # sessions spread over backends
    assert min(cached_later) > 0.8
    state = the_router(router)
    state.indexes.check_invariants()
    for engine in engines[:2]:  # the precise index is exactly each backend's cache
        assert engine.llm.kv_events is not None and engine.llm.kv_events.wait_sent()
    deadline = time.monotonic() + 10
    prompts = [state.tokens.tokenizer.chat_ids([{"role": "system", "content":
                                                 f"session {s} " + "rules " * 40}])
               for s in range(6)]  # fmt: skip
    while True:
        agree = all(state.indexes.cached_tokens(p, 3)[i] == engines[i].llm.cache.lookup(p)
                    for p in prompts for i in (0, 1))  # fmt: skip
        if agree or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert agree


def test_streams_pass_through_as_a_direct_call_gives_them(router, cluster) -> None:
    _, _servers = cluster
    messages = [{"role": "user", "content": "stream me " * 20}]
    through = openai.OpenAI(base_url=f"{router.base_url}/v1", api_key="x")
    first = through.chat.completions.with_raw_response.create(
        model=NAME, messages=messages, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True})  # fmt: skip
    backend = first.headers[ROUTED_TO_HEADER]
    routed = [c.model_dump(exclude={"id", "created"}) for c in first.parse()]
    direct = openai.OpenAI(base_url=f"{backend}/v1", api_key="x")
    chunks = direct.chat.completions.create(model=NAME, messages=messages, max_tokens=6,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})  # fmt: skip
    expected = [c.model_dump(exclude={"id", "created"}) for c in chunks]
    for chunk in routed + expected:  # the second call hits the cache the first one filled
        if chunk.get("usage"):
            chunk["usage"].pop("prompt_tokens_details", None)
    assert routed == expected and len(routed) >= 3


def test_errors_pass_through_unchanged(router, cluster) -> None:
    _, servers = cluster
    bad = {"model": NAME, "prompt": "hi", "max_tokens": -1}
    routed = httpx.post(f"{router.base_url}/v1/completions", json=bad)
    direct = httpx.post(f"{servers[0].base_url}/v1/completions", json=bad)
    assert routed.status_code == direct.status_code == 400
    assert routed.json() == direct.json()
    broken = httpx.post(f"{router.base_url}/v1/completions", content=b"{not json",
                        headers={"content-type": "application/json"})  # fmt: skip
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "json_invalid"
    unknown = httpx.post(f"{router.base_url}/v1/completions",
                         json={"model": "other", "prompt": "x", "max_tokens": 1})  # fmt: skip
    assert unknown.status_code == 404


def test_token_id_prompts_and_session_headers(router, cluster) -> None:
    prompt = list(range(40, 80))
    session = {"x-session-id": "s-1"}
    first = httpx.post(f"{router.base_url}/v1/completions", headers=session,
                       json={"model": NAME, "prompt": prompt, "max_tokens": 2})  # fmt: skip
    again = httpx.post(f"{router.base_url}/v1/completions", json={
        "model": NAME, "prompt": [*prompt, 5, 6], "max_tokens": 2},
        headers={"x-session-id": "s-1"})  # fmt: skip
    assert first.status_code == again.status_code == 200
    assert first.headers[ROUTED_TO_HEADER] == again.headers[ROUTED_TO_HEADER]
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 40
    metrics = httpx.get(f"{router.base_url}/metrics").text
    assert "prefixcache_router_requests_total" in metrics
    assert json.loads(httpx.get(f"{router.base_url}/router/stats").text)["sessions"] >= 1


def finished(base_url: str, reason: str) -> float:
    """A backend's count of completions that ended with ``reason``."""
    prefix = f'prefixcache_request_success_total{{finish_reason="{reason}"}}'
    for line in httpx.get(f"{base_url}/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_leaving_mid_stream_aborts_the_backends_request(router, cluster) -> None:
    """The client closes a routed stream while the backend is held mid-generation: the router
    closes its stream to the backend, which aborts the request (not run to its length) and
    frees its blocks."""
    engines, servers = cluster
    body = {"model": NAME, "prompt": list(range(100, 140)), "max_tokens": 1500,
            "ignore_eos": True, "stream": True}  # fmt: skip
    before = {s.base_url: (finished(s.base_url, "length"), finished(s.base_url, "abort"))
              for s in servers}  # fmt: skip
    with httpx.Client(timeout=60) as client, client.stream(
        "POST", f"{router.base_url}/v1/completions", json=body
    ) as response:
        backend = response.headers[ROUTED_TO_HEADER]
        events = (line for line in response.iter_lines() if line)
        assert all(next(events).startswith("data: {") for _ in range(3))
        engine = engines[[s.base_url for s in servers].index(backend)]
        with EngineGate(engine) as gate:
            assert gate.stats["running"] == 1
            response.close()  # the client leaves
    deadline = time.monotonic() + 30
    while finished(backend, "abort") == before[backend][1] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert finished(backend, "abort") == before[backend][1] + 1
    assert finished(backend, "length") == before[backend][0]
    while engine.llm.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.llm.stats()["running"] == 0 and engine.llm.stats()["in_use"] == 0
