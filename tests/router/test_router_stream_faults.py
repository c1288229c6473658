"""A backend whose stream breaks after its first event: the client's stream through the router
ends with an OpenAI error event and ``[DONE]`` (never a silently cut stream, never a 500),
the openai client raises on it, and the router keeps routing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import httpx
import openai
import pytest
from fastapi import FastAPI
from starlette.responses import JSONResponse, StreamingResponse

from prefixcache.integrations.router.app import RouterConfig, build_router_app
from prefixcache.integrations.server import BackgroundServer

FIRST = {"id": "c1", "object": "text_completion", "created": 1, "model": "m",
         "choices": [{"index": 0, "text": "a", "finish_reason": None, "logprobs": None}]}


def breaking_backend(cut_mid_event: bool) -> FastAPI:
    """An OpenAI-shaped backend whose streams break (the connection is dropped) after one
    event, or in the middle of the second when ``cut_mid_event``; its whole answers work."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.post("/v1/completions")
    async def completions(body: dict) -> object:
        if not body.get("stream"):
            return JSONResponse({**FIRST, "choices": [{**FIRST["choices"][0], "text": "whole",
                                                       "finish_reason": "length"}]})

        async def events() -> AsyncIterator[bytes]:
            yield f"data: {json.dumps(FIRST)}\n\n".encode()
            if cut_mid_event:
                yield b'data: {"id": "c1", "obj'
            raise ConnectionResetError("the backend went away")  # uvicorn drops the connection

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(params=[False, True], ids=["between-events", "mid-event"])
def router(request: pytest.FixtureRequest) -> Iterator[BackgroundServer]:
    with BackgroundServer(breaking_backend(request.param)) as backend:
        config = RouterConfig([backend.base_url], health_interval_s=0.2)
        with BackgroundServer(build_router_app(config), lifespan="on") as running:
            yield running


def test_a_stream_broken_by_the_backend_ends_with_an_error_event(router) -> None:
    body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 5, "stream": True}
    with httpx.stream("POST", f"{router.base_url}/v1/completions", json=body,
                      timeout=30) as response:  # fmt: skip
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[0][6:]) == FIRST
    error = json.loads(events[-2][6:])["error"]
    assert error["code"] == "backend_failed" and error["type"] == "server_error"
    assert events[-1] == "data: [DONE]"
    client = openai.OpenAI(base_url=f"{router.base_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in client.completions.create(model="m", prompt=[1, 2, 3], max_tokens=5,
                                           stream=True):  # fmt: skip
            pass
    whole = httpx.post(f"{router.base_url}/v1/completions", timeout=30,
                       json={"model": "m", "prompt": [1, 2, 3], "max_tokens": 5})  # fmt: skip
    assert whole.status_code == 200 and whole.json()["choices"][0]["text"] == "whole"
