"""A remote target: any OpenAI-compatible server, streamed through ``/v1/completions``.

Prompts go out as token-id lists (vLLM, SGLang, llama.cpp and our server accept them) with
``ignore_eos`` so output lengths are exact, and ``stream_options.include_usage`` so the last
chunk reports prompt, completion and cached tokens. Connection failures, HTTP errors,
error chunks and timeouts end up in ``RequestResult.error``; nothing here raises for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from typing import Any

import httpx

from prefixcache.integrations.bench.bench_request import BenchRequest
from prefixcache.integrations.bench.prometheus_scrape import ServerGauges, parse_metrics
from prefixcache.integrations.bench.request_result import RequestResult

METRICS_SAMPLE_SECONDS = 0.5


def check_base_url(base_url: str) -> None:
    """ValueError unless ``base_url`` is an http(s) URL with a host."""
    try:
        parsed = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError) as error:
        raise ValueError(f"bad URL {base_url!r}: {error}") from error
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(
            f"bad URL {base_url!r}: give an http(s) base URL such as http://127.0.0.1:8000"
        )


def check_timeout(timeout_s: float) -> None:
    """ValueError unless ``timeout_s`` is a finite number of seconds > 0."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
        math.isfinite(timeout_s) and timeout_s > 0
    ):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout_s!r}")


class UrlTarget:
    """``base_url`` like ``http://127.0.0.1:8000`` (a trailing ``/v1`` is accepted); the
    constructor raises ValueError for a malformed URL or a ``timeout_s`` that is not > 0."""

    kind = "url"

    def __init__(
        self,
        base_url: str,
        label: str | None = None,
        model: str | None = None,
        timeout_s: float = 300.0,
        api_key: str | None = None,
    ) -> None:
        check_base_url(base_url)
        check_timeout(timeout_s)
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.label = label or self.base_url
        self.model = model
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.setup_error: str | None = None
        self.peak_kv_usage: float | None = None
        self.final_stats: dict[str, Any] = {}
        self._gauges_at_start: ServerGauges | None = None
        self._client: httpx.AsyncClient | None = None
        self._sampler: asyncio.Task | None = None

    @property
    def model_name(self) -> str:
        return self.model or "unknown"

    async def start(self, warmup: bool = True) -> None:
        """Discover the model from ``/v1/models`` unless given; a failure is recorded in
        ``setup_error`` (the requests then fail and are counted) rather than raised."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.base_url, timeout=self.timeout_s, headers=headers
        )
        if self.model is None:
            try:
                response = await self._client.get("/v1/models")
                response.raise_for_status()
                self.model = str(response.json()["data"][0]["id"])
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
                self.setup_error = f"model discovery failed: {_describe(error)}"
        self._gauges_at_start = await self._scrape()
        self._sampler = asyncio.create_task(self._sample_usage())

    async def send(self, request: BenchRequest, result: RequestResult) -> None:
        assert self._client is not None, "start() first"
        payload: dict[str, Any] = {
            "model": self.model_name,
            "prompt": list(request.prompt_token_ids),
            "max_tokens": request.max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        chunks = 0
        result.start = time.perf_counter()
        try:
            async with self._client.stream("POST", "/v1/completions", json=payload) as response:
                if response.status_code >= 400:
                    body = (await response.aread()).decode("utf-8", "replace")
                    result.error = f"HTTP {response.status_code}: {_error_message(body)}"
                    return
                async for line in response.aiter_lines():
                    data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
                    if not data:
                        continue
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if chunk.get("error"):
                        result.error = f"stream error: {_error_message(json.dumps(chunk))}"
                        return
                    if chunk.get("choices"):
                        result.token_times.append(time.perf_counter())
                        chunks += 1
                    if chunk.get("usage"):
                        _read_usage(chunk["usage"], result)
            result.end = time.perf_counter()
            if not result.output_tokens:
                result.output_tokens = chunks
            if not result.token_times:
                result.error = "no tokens streamed"
        except httpx.TimeoutException:
            result.error = f"timeout after {self.timeout_s:g} s"
        except (httpx.HTTPError, json.JSONDecodeError) as error:
            result.error = _describe(error)

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        end = await self._scrape()
        start = self._gauges_at_start
        if end is not None and start is not None:
            hits = _delta(start.prefix_hit_tokens, end.prefix_hit_tokens)
            queries = _delta(start.prefix_query_tokens, end.prefix_query_tokens)
            if hits is not None and queries:
                self.final_stats["metrics_hit_rate"] = hits / queries
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _scrape(self) -> ServerGauges | None:
        assert self._client is not None
        try:
            response = await self._client.get("/metrics", timeout=5.0)
        except httpx.HTTPError:
            return None
        return parse_metrics(response.text) if response.status_code == 200 else None

    async def _sample_usage(self) -> None:
        while True:
            gauges = await self._scrape()
            if gauges is not None and gauges.kv_usage is not None:
                self.peak_kv_usage = max(self.peak_kv_usage or 0.0, gauges.kv_usage)
            await asyncio.sleep(METRICS_SAMPLE_SECONDS)


def _read_usage(usage: dict[str, Any], result: RequestResult) -> None:
    if isinstance(usage.get("completion_tokens"), int):
        result.output_tokens = usage["completion_tokens"]
    details = usage.get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        result.cached_tokens = details["cached_tokens"]


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _error_message(body: str) -> str:
    """The OpenAI-style ``error.message`` if the body has one, else the body (shortened)."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if message:
            return str(message)[:200]
    return body.strip()[:200] or "(empty body)"


def _describe(error: BaseException) -> str:
    text = str(error) or repr(error)
    return f"{type(error).__name__}: {text}"[:300]
