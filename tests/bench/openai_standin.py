"""A small OpenAI-compatible server for the url-target tests: real HTTP, real tokens.

``/v1/models``, streaming ``/v1/completions`` (token-id prompts, ``ignore_eos``,
``stream_options.include_usage`` with ``prompt_tokens_details.cached_tokens``) and a
Prometheus ``/metrics`` page, all backed by an ``AsyncLLM``. ``failing_app`` answers every
completion with an error status, or never answers (``hang``), for the error-path tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.engine.sampling_params import SamplingParams


def completions_app(engine: AsyncLLM, model_name: str, report_cached: bool = True) -> FastAPI:
    """``report_cached=False`` leaves ``prompt_tokens_details`` out of the usage chunk (as
    some servers do), so clients must read the hit rate from ``/metrics``."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model"}]}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        stats = engine.stats()
        return (
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc {stats['usage']}\n"
            "# TYPE vllm:prefix_cache_hits counter\n"
            f"vllm:prefix_cache_hits_total {stats['hit_tokens']}\n"
            "# TYPE vllm:prefix_cache_queries counter\n"
            f"vllm:prefix_cache_queries_total {stats['query_tokens']}\n"
        )

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        if body.get("model") != model_name:
            return _error(404, f"model {body.get('model')!r} does not exist")
        try:
            params = SamplingParams(
                max_tokens=body.get("max_tokens", 16),
                temperature=body.get("temperature", 1.0),
                ignore_eos=bool(body.get("ignore_eos", False)),
            )
            stream = engine.generate(body["prompt"], params)
            first = await anext(stream)
        except (ValueError, TypeError, KeyError) as error:
            return _error(400, str(error))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            _sse(first, stream, model_name, include_usage, report_cached),
            media_type="text/event-stream",
        )

    return app


async def _sse(
    first, stream, model_name: str, include_usage: bool, report_cached: bool
) -> AsyncIterator[str]:
    sent_text = ""
    output = first
    while True:
        delta, sent_text = output.text[len(sent_text) :], output.text
        chunk = {
            "id": output.request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [
                {
                    "index": 0,
                    "text": delta,
                    "finish_reason": output.finish_reason if output.finished else None,
                }
            ],
        }
        yield f"data: {json.dumps(chunk)}\n\n"
        if output.finished:
            break
        output = await anext(stream)
    if include_usage:
        prompt, completion = len(output.prompt_token_ids), len(output.token_ids)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": output.num_cached_tokens}
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


def failing_app(mode: str) -> FastAPI:
    """``mode`` "error": every completion is a 503 with an OpenAI error body; "hang": the
    server accepts the request and never answers."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "standin", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions() -> JSONResponse:
        if mode == "hang":
            await asyncio.Event().wait()  # cancelled when the server shuts down
        return _error(503, "the server is overloaded")

    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "code": status}},
        status_code=status,
    )


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yields its base URL and
    stops the server on exit."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        timeout_graceful_shutdown=1,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="standin-server", daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the stand-in server did not start")
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
