"""PrefixCacheIngress: the OpenAI HTTP surface of a Serve application of prefixcache replicas.

It counts each request's prompt tokens the way the replicas will (the served model's tokenizer
and chat template, resent pieces from a cache), names its session (``prompt_cache_key``,
``user``, ``X-Session-Id``), and hands a ``RoutedCall`` to the replicas' deployment handle,
whose ``PrefixCacheRequestRouter`` picks the replica. The replica's answer is passed on as it
streams, status, headers and errors unchanged, plus ``x-prefixcache-replica``.

(No ``from __future__ import annotations`` here: Serve's class-based FastAPI views read the
route methods' annotations as objects.)
"""


from collections.abc import AsyncIterator
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from prefixcache.integrations.ray.replica import ReplyHead, RoutedCall
from prefixcache.integrations.router.forwarding import forward_headers, passed_on_headers
from prefixcache.integrations.router.prompt_tokenizer import PromptTokenizer
from prefixcache.integrations.router.request_tokens import RequestTokens, session_key

api = FastAPI(title="prefixcache on Ray Serve")


def _request_router(handle: DeploymentHandle) -> object | None:
    """The handle's request router; Serve keeps it inside its (private) router objects."""
    router = getattr(handle, "_router", None)
    router = getattr(router, "_asyncio_router", router)
    return getattr(router, "request_router", None)


@serve.ingress(api)
class PrefixCacheIngress:
    """``replicas``: the handle of the ``PrefixCacheReplica`` deployment; ``tokenizer``: the
    model spec whose tokenizer and chat template the replicas use."""

    def __init__(self, replicas: DeploymentHandle, tokenizer: str) -> None:
        self.replicas = replicas
        self.tokens = RequestTokens(PromptTokenizer.load(tokenizer), None)

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self._route(request, "/v1/completions")

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self._route(request, "/v1/chat/completions")

    @api.get("/v1/models")
    async def models(self) -> Response:
        status, body = await self.replicas.get.remote("/v1/models")
        return Response(body, status, media_type="application/json")

    @api.get("/health")
    async def health(self) -> Response:
        status, body = await self.replicas.get.remote("/health")
        return Response(body, status, media_type="application/json")

    @api.get("/router/stats")
    async def router_stats(self) -> dict[str, Any]:
        """What this ingress's request router knows of each replica (empty before the first
        request, or if this Ray version keeps the router elsewhere)."""
        router = _request_router(self.replicas)
        state = router.routing_state() if hasattr(router, "routing_state") else {}
        return {"policy": getattr(getattr(router, "policy", None), "name", None),
                "replicas": state}  # fmt: skip

    async def _route(self, request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body: Any = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            body = None  # the replica answers the malformed request as the server does
        call = RoutedCall(path, raw, tuple(forward_headers(request.headers).items()),
                          await self.tokens.prompt_ids(path, body),
                          session_key(body, request.headers))  # fmt: skip
        stream = self.replicas.options(stream=True).call.remote(call)
        try:
            head: ReplyHead = await stream.__anext__()
        except Exception as error:  # the replica failed before answering
            stream.cancel()
            return JSONResponse({"error": {"message": f"no replica answered: {error}",
                                           "type": "service_unavailable", "param": None,
                                           "code": "no_replica"}}, 503)  # fmt: skip
        headers = passed_on_headers(head.headers)
        if not headers.get("content-type", "").startswith("text/event-stream"):
            content = b"".join([chunk async for chunk in stream])
            return Response(content, head.status, headers)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                stream.cancel()

        return StreamingResponse(relay(), head.status, headers)

