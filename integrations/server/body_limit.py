"""A cap on request body size, answered 413 in the OpenAI error shape.

Without one, a client can make the server read, parse and hold an arbitrarily large body
before any check on its prompt runs; parsing is the one step that holds the event loop (C
code under the GIL), so the cap bounds that stall. Its default comes from the request's
prompt-token cap (``limits.default_max_body_bytes``).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prefixcache.integrations.server.errors import BodyTooLarge, body_too_large, error_response


class BodyLimitMiddleware:
    """413 ``request_too_large`` for an HTTP request body over ``max_bytes``: before reading
    it when its Content-Length says so, else as soon as the bytes received pass the cap."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await error_response(body_too_large(self.max_bytes))(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
