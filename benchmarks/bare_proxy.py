"""A proxy that forwards every POST to one backend the way ``prefixcache router`` does (body
read from ASGI, ``open_response`` on aiohttp, a stream relayed chunk by chunk) but decides
nothing: no parse, no index, no policy. ``router_overhead.py`` times it beside the router, so
the router's own cost (routed - bare) is told apart from the hop any proxy adds.

    python benchmarks/bare_proxy.py PORT BACKEND_URL
"""

from __future__ import annotations

import sys

import uvicorn
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from prefixcache.integrations.router.forwarding import (
    BackendUnavailable,
    forwarding_session,
    open_response,
)
from prefixcache.integrations.router.routed_paths import read_body, relay


class BareProxy:
    def __init__(self, backend: str) -> None:
        self.backend = backend.rstrip("/")
        self.session = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["method"] != "POST":  # /health, for the launcher: it is up
            await JSONResponse({"status": "ok"})(scope, receive, send)
            return
        raw = await read_body(receive)
        try:
            response = await open_response(
                self.session, f"{self.backend}{scope['path']}", raw or b"",
                Headers(scope=scope), lambda: None, lambda: None,
            )  # fmt: skip
        except BackendUnavailable as error:
            response = JSONResponse({"error": {"message": str(error)}}, 502)
        if isinstance(response, StreamingResponse):
            await relay(response, receive, send)
        else:
            await response(scope, receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = forwarding_session()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


if __name__ == "__main__":
    uvicorn.run(BareProxy(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]),
                log_level="warning")  # fmt: skip
