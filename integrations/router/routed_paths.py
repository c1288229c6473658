"""The router's ASGI entry: its two routed POSTs go straight to the ``Router``, the rest to
FastAPI.

FastAPI's request object, middleware stack and endpoint dispatch, and ``StreamingResponse``'s
task group, cost a few tenths of a millisecond of a routed request's TTFT; here the body is
read from ASGI messages and the backend's answer sent back as it comes (a stream by
``relay``). Everything else (``/v1/models``,
``/health``, ``/router/stats``, ``/metrics``, the lifespan that starts the router) is the
FastAPI app's.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

if TYPE_CHECKING:
    from prefixcache.integrations.router.app import Router

ROUTED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
MAX_BODY_BYTES = 256 << 20  # a larger request body is refused (413)


class RoutedPaths:
    """ASGI app: ``POST`` to one of ``paths`` runs ``routers["router"].route`` once the router
    has started; any other request, and the lifespan, goes to ``api``."""

    def __init__(self, api: FastAPI, routers: dict[str, Router], paths: frozenset[str]) -> None:
        self.api = api
        self.routers = routers
        self.paths = paths
        self.state = api.state  # as FastAPI's own: ``state.routers``

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        router = self.routers.get("router")
        if (router is None or scope["type"] != "http" or scope["method"] != "POST"
                or scope["path"] not in self.paths):  # fmt: skip
            await self.api(scope, receive, send)
            return
        raw = await read_body(receive)
        if raw is None:
            response: Any = JSONResponse(
                {"error": {"message": f"the request body is over {MAX_BODY_BYTES} bytes",
                           "type": "invalid_request_error", "param": None,
                           "code": "body_too_large"}}, 413)  # fmt: skip
        else:
            response = await router.route(raw, Headers(scope=scope), scope["path"])
        if isinstance(response, StreamingResponse):
            await relay(response, receive, send)
        else:
            await response(scope, receive, send)


async def relay(response: StreamingResponse, receive: Receive, send: Send) -> None:
    """A streamed answer passed on chunk by chunk, as ``StreamingResponse`` would, without
    its task group (~0.2 ms before the first chunk): a client that disconnects is noticed at
    the next chunk, and the backend's stream is then closed (which aborts it there)."""
    watcher = asyncio.ensure_future(_disconnect(receive))
    chunks = response.body_iterator
    try:
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": response.raw_headers})  # fmt: skip
        async for chunk in chunks:
            if watcher.done():
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        watcher.cancel()
        await chunks.aclose()  # type: ignore[attr-defined]


async def _disconnect(receive: Receive) -> None:
    """Returns once the client has gone (the body was read before)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def read_body(receive: Receive) -> bytes | None:
    """The request body (None past MAX_BODY_BYTES; an early disconnect ends it)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)
