"""One HTTP request through an ASGI app in this process, its response body streamed out.

A Serve replica runs prefixcache's own OpenAI app (``prefixcache.integrations.server``) and
answers the ingress through it, so every endpoint, error and stream format is the server's.
httpx's ``ASGITransport`` would fit but returns only after the whole body (no token streaming),
so this drives the app by the ASGI spec: the request body is received once; the response
start gives status and headers; body messages are yielded as they are sent. Closing the
iterator early (the client went away) tells the app ``http.disconnect`` and cancels it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
AsgiApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class AsgiReply:
    """Status and headers of a response whose body is read from ``body``."""

    status: int
    headers: list[tuple[str, str]]
    body: AsyncIterator[bytes]


async def call_asgi(app: AsgiApp, method: str, path: str, headers: Sequence[tuple[str, str]],
                    body: bytes) -> AsgiReply:  # fmt: skip
    """Start the request; returns once the app sent its response start. An app that fails
    before that raises its exception here."""
    messages: asyncio.Queue[dict | None] = asyncio.Queue()
    disconnected = asyncio.Event()
    received = False

    async def receive() -> dict:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await messages.put(message)

    path_only, _, query = path.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path_only, "raw_path": path_only.encode(),
        "query_string": query.encode(), "root_path": "", "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 80),
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
    }
    task = asyncio.ensure_future(app(scope, receive, send))
    task.add_done_callback(lambda _: messages.put_nowait(None))

    start = await messages.get()
    if start is None or start.get("type") != "http.response.start":
        await _finish(task, disconnected)
        task.result()  # the app's exception, if it raised one
        raise RuntimeError("the app returned without a response")
    reply_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start["headers"]]

    async def body_chunks() -> AsyncIterator[bytes]:
        try:
            while (message := await messages.get()) is not None:
                if message.get("type") != "http.response.body":
                    continue
                if chunk := message.get("body", b""):
                    yield chunk
                if not message.get("more_body", False):
                    break
        finally:
            await _finish(task, disconnected)

    return AsgiReply(start["status"], reply_headers, body_chunks())


async def _finish(task: asyncio.Future, disconnected: asyncio.Event) -> None:
    """Let a finished app end; tell an unfinished one the client left, then cancel it."""
    if not task.done():
        disconnected.set()
        await asyncio.sleep(0)
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
