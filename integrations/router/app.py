"""The cache-aware router: an OpenAI-compatible proxy over N backends (ASGI for the routed
POSTs, FastAPI for the rest; aiohttp forwards, httpx checks the backends).

``POST /v1/completions`` and ``/v1/chat/completions`` are routed: the prompt's token ids are
matched against every backend's index (``PrefixIndexes``) and ``RoutingPolicy.choose`` picks
the backend, the same decision the simulator replays. A session (OpenAI ``prompt_cache_key``,
``user``, or an ``X-Session-Id`` header) stays on its backend while that backend is within
``sticky_slack_s`` of the best. A backend that fails before answering is taken out (a
transport error) or passed over (429/502/503/504) and the request goes to the next best.
``GET /v1/models`` is any healthy backend's; ``/health`` is 200 while one backend is up;
``/router/stats`` and ``/metrics`` show the decisions.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from prefixcache.integrations.router.backend_pool import Backend, BackendPool, EventSource
from prefixcache.integrations.router.forwarding import (
    BackendUnavailable,
    forwarding_session,
    open_response,
)
from prefixcache.integrations.router.prefix_indexes import PrefixIndexes
from prefixcache.integrations.router.prompt_tokenizer import PromptTokenizer
from prefixcache.integrations.router.request_body import BodyParser
from prefixcache.integrations.router.request_tokens import (
    RequestTokens,
    affinity_key,
    session_key,
)
from prefixcache.integrations.router.routed_paths import ROUTED_PATHS, RoutedPaths
from prefixcache.integrations.router.scoring import CostModel, RoutingPolicy

MAX_SESSIONS = 100_000


@dataclass
class RouterConfig:
    """``prefill_tokens_per_s``: the backends' prefill speed, what a cached token is worth in
    the estimated TTFT; ``approx_blocks`` x ``approx_block_size``: the capacity assumed of a
    backend without events."""

    backends: list[str]
    policy: str = "cache_aware"
    tokenizer: PromptTokenizer | None = None
    events: dict[str, EventSource] = field(default_factory=dict)
    prefill_tokens_per_s: float = 2000.0
    health_interval_s: float = 0.5
    approx_blocks: int = 65536
    approx_block_size: int = 16
    sticky_slack_s: float = 0.5
    seed: int = 0


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("prefixcache_router_requests", "Requests routed, by backend",
                                ["backend"], registry=self.registry)  # fmt: skip
        self.retries = Counter("prefixcache_router_retries", "Requests sent to another "
                               "backend after one failed", registry=self.registry)  # fmt: skip
        self.cached_tokens = Counter("prefixcache_router_estimated_cached_tokens",
                                     "Prompt tokens the chosen backend held, by the index",
                                     ["backend"], registry=self.registry)  # fmt: skip
        self.prompt_tokens = Counter("prefixcache_router_prompt_tokens", "Prompt tokens routed",
                                     ["backend"], registry=self.registry)  # fmt: skip
        self.decision = Histogram(
            "prefixcache_router_decision_seconds", "Tokenize + match + choose, per request",
            registry=self.registry, buckets=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 1.0),
        )


class Router:
    """The routing state of one router process (one event loop)."""

    def __init__(self, config: RouterConfig, client: httpx.AsyncClient,
                 session: aiohttp.ClientSession) -> None:  # fmt: skip
        """``client`` checks the backends and asks them what they hold; ``session`` forwards
        the requests (``forwarding_session``)."""
        self.config = config
        self.client = client
        self.session = session
        self.indexes = PrefixIndexes(config.approx_blocks, config.approx_block_size)
        self.pool = BackendPool(config.backends, client, self.indexes, config.events,
                                config.health_interval_s)  # fmt: skip
        self.policy = RoutingPolicy(config.policy, CostModel(1.0 / config.prefill_tokens_per_s),
                                    config.seed, config.sticky_slack_s)  # fmt: skip
        self.tokens = RequestTokens(config.tokenizer, self.pool)
        self.body_parser = BodyParser()
        self.sessions: OrderedDict[str, int] = OrderedDict()
        self.metrics = _Metrics()

    async def route(self, raw: bytes, headers: Mapping[str, str], path: str) -> Response:
        """Route one request (``raw``, its body, and ``headers``) to ``path`` of a backend; the
        backend's answer (a ``StreamingResponse`` for a stream), or a 503 when none takes it."""
        started = time.perf_counter()
        body = self.body_parser.parse(raw)
        prompt = await self.tokens.prompt_ids(path, body)
        session = session_key(body, headers)
        affinity = affinity_key(session, prompt)
        num_tokens = 0 if prompt is None else len(prompt)
        n = len(self.pool.backends)
        if prompt is not None and self.policy.uses_cache:
            cached = self.indexes.cached_tokens(prompt, n)
        else:
            cached = np.zeros(n)
        excluded: set[int] = set()
        decided = False
        while True:
            healthy = self.pool.healthy_mask()
            healthy[list(excluded)] = False
            if not healthy.any():
                return _no_backend(n, excluded)
            sticky = self.sessions.get(session or "")
            choice = self.policy.choose(num_tokens, cached, self.pool.backlog(),
                                        affinity, healthy, sticky)  # fmt: skip
            if not decided:
                self.metrics.decision.observe(time.perf_counter() - started)
                decided = True
            backend = self.pool.backends[choice]
            uncached = max(num_tokens - int(cached[choice]), 0)
            try:
                response = await self._send(backend, path, raw, headers, uncached)
            except BackendUnavailable as error:
                excluded.add(choice)
                self.metrics.retries.inc()
                if error.transport:
                    await self.pool.mark_down(backend, str(error))
                continue
            self._routed(backend, session, prompt, int(cached[choice]))
            return response

    async def _send(self, backend: Backend, path: str, raw: bytes, headers: Mapping[str, str],
                    uncached: int) -> Response:  # fmt: skip
        estimate = uncached / self.config.prefill_tokens_per_s
        backend.backlog_s += estimate
        backend.in_flight += 1
        state = {"started": False}

        def started() -> None:
            state["started"] = True
            backend.backlog_s = max(backend.backlog_s - estimate, 0.0)

        def finished() -> None:
            backend.in_flight -= 1

        try:
            return await open_response(self.session, f"{backend.url}{path}", raw, headers,
                                       started, finished)  # fmt: skip
        except BaseException:
            if not state["started"]:
                started()
                finished()
            raise

    def _routed(self, backend: Backend, session: str | None, prompt: np.ndarray | None,
                cached: int) -> None:  # fmt: skip
        backend.routed += 1
        label = backend.url
        self.metrics.requests.labels(label).inc()
        if prompt is not None and len(prompt):
            self.metrics.prompt_tokens.labels(label).inc(len(prompt))
            self.metrics.cached_tokens.labels(label).inc(cached)
            if not backend.precise:
                self.indexes.record_routed(backend.number, prompt)
        if session:
            self.sessions[session] = backend.number
            self.sessions.move_to_end(session)
            if len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)

    def stats(self) -> dict[str, Any]:
        return {"policy": self.policy.name, "sessions": len(self.sessions),
                "backends": [b.to_json(self.indexes) for b in self.pool.backends]}  # fmt: skip


def _no_backend(total: int, tried: set[int]) -> JSONResponse:
    message = (f"no backend could take the request ({len(tried)} tried, "
               f"{total - len(tried)} others down)")  # fmt: skip
    return JSONResponse({"error": {"message": message, "type": "service_unavailable",
                                   "param": None, "code": "no_backend"}}, 503)  # fmt: skip


def build_router_app(config: RouterConfig) -> RoutedPaths:
    """The router's ASGI app; backends are checked at startup and every health interval. The
    routed POSTs run on the router straight from ASGI (``RoutedPaths``), the rest on FastAPI."""
    state: dict[str, Router] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        timeout = httpx.Timeout(connect=5.0, read=None, write=30.0, pool=None)
        async with (httpx.AsyncClient(limits=limits, timeout=timeout) as client,
                    forwarding_session() as session):  # fmt: skip
            router = Router(config, client, session)
            state["router"] = router
            await router.pool.start()
            try:
                yield
            finally:
                await router.pool.stop()

    app = FastAPI(title="prefixcache router", lifespan=lifespan)
    app.state.routers = state

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await state["router"].route(await request.body(), request.headers,
                                           "/v1/completions")  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await state["router"].route(await request.body(), request.headers,
                                           "/v1/chat/completions")  # fmt: skip

    @app.get("/v1/models")
    @app.get("/v1/models/{model_id:path}")
    async def models(request: Request) -> Response:
        router = state["router"]
        for backend in router.pool.backends:
            if backend.healthy:
                url = f"{backend.url}{request.url.path}"
                with contextlib.suppress(httpx.HTTPError):
                    upstream = await router.client.get(url, headers=_auth(request), timeout=10)
                    return Response(upstream.content, upstream.status_code,
                                    media_type=upstream.headers.get("content-type"))  # fmt: skip
        return _no_backend(len(router.pool.backends), set())

    @app.get("/health")
    async def health() -> Response:
        up = int(state["router"].pool.healthy_mask().sum())
        return JSONResponse({"status": "ok" if up else "no_backend", "healthy_backends": up},
                            200 if up else 503)  # fmt: skip

    @app.get("/router/stats")
    async def stats() -> dict[str, Any]:
        return state["router"].stats()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state["router"].metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)  # fmt: skip

    return RoutedPaths(app, state, ROUTED_PATHS)


def _auth(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() in ("authorization",
                                                                        "x-api-key")}  # fmt: skip
