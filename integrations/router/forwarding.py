"""Forwarding one request to one backend, committing only once the backend has answered.

``open_response`` returns the client's response only after the backend sent its status and,
for a stream, its first chunk; until then any failure raises ``BackendUnavailable`` and the
router may try another backend with nothing sent to the client, so a request is never lost
or answered twice. Bytes pass through unchanged, status and headers too; a stream is passed
on as the backend's chunks arrive, cut at event boundaries. A client that disconnects closes
the backend's stream (which aborts the request there); a backend that fails mid-stream ends
the client's stream with an OpenAI error event (an event it cut short is dropped).

The hop runs on aiohttp's client (its HTTP parser is compiled): a 150 KB request streamed to
a backend and its first chunk back cost ~0.4 ms there against ~1 ms on httpx's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping

import aiohttp
from starlette.responses import Response, StreamingResponse

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Statuses another backend may not give: overloaded, draining or gone."""
_HOP_HEADERS = frozenset({"host", "content-length", "connection", "keep-alive",
                          "transfer-encoding", "te", "upgrade", "accept-encoding",
                          "proxy-authorization", "proxy-connection"})  # fmt: skip
_DROP_RESPONSE = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive",
                            "content-encoding"})  # fmt: skip


class BackendUnavailable(Exception):
    """The backend failed before answering; ``transport`` when it could not be reached."""

    def __init__(self, message: str, transport: bool) -> None:
        super().__init__(message)
        self.transport = transport


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    kept = {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}
    kept["accept-encoding"] = "identity"
    return kept


ROUTED_TO_HEADER = "x-prefixcache-backend"


def passed_on_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """A backend's response headers a client should see (length and framing are redone)."""
    return {k: v for k, v in headers if k.lower() not in _DROP_RESPONSE}


def forwarding_session() -> aiohttp.ClientSession:
    """The session requests are forwarded on (open it inside the event loop that uses it):
    unlimited pooled connections, 5 s to connect, no read deadline (a stream lasts as long as
    its generation), bytes as the backend sent them."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
        timeout=aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=None),
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )


def _response_headers(response: aiohttp.ClientResponse) -> dict[str, str]:
    """The backend's headers a client should see, plus which backend answered."""
    kept = passed_on_headers(response.headers.items())
    kept[ROUTED_TO_HEADER] = str(response.url.origin())
    return kept


_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def _split_events(data: bytes) -> tuple[bytes, bytes]:
    """``data`` cut after its last whole server-sent event (a blank line ends one: LF, CRLF or
    CR line ends): (whole events, the rest)."""
    end = 0
    for blank in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        at = data.rfind(blank)
        if at >= 0:
            end = max(end, at + len(blank))
    return data[:end], data[end:]


def _stream_failure(error: BaseException) -> bytes:
    """What a client gets when the backend's stream breaks (after the whole events it sent;
    an event cut short is dropped): an OpenAI error event, as our server sends one for a
    request that fails mid-stream, then ``[DONE]``."""
    body = {"error": {"message": f"the backend failed mid-stream ({type(error).__name__})",
                      "type": "server_error", "param": None, "code": "backend_failed"}}
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"


async def open_response(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    on_started: Callable[[], None],
    on_finished: Callable[[], None],
) -> Response:
    """The client's response from ``url``. ``on_started`` runs once the backend answered
    (first chunk), ``on_finished`` once its answer is fully passed on or abandoned; neither
    runs when BackendUnavailable is raised."""
    try:
        upstream = await session.post(url, data=body, headers=forward_headers(headers))
    except _TRANSPORT_ERRORS as error:
        raise BackendUnavailable(f"{type(error).__name__}: {error}", transport=True) from None
    streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")
    try:
        if upstream.status in RETRY_STATUSES:
            await upstream.read()
            raise BackendUnavailable(f"answered {upstream.status}", transport=False)
        if streaming:
            first = await upstream.content.readany()
        else:  # read whole before committing: a backend dying mid-body can still be retried
            first = await upstream.read()
    except _TRANSPORT_ERRORS as error:
        upstream.close()
        raise BackendUnavailable(f"{type(error).__name__}: {error}", transport=True) from None
    except BaseException:
        upstream.close()
        raise
    on_started()
    if not streaming:
        upstream.release()
        on_finished()
        return Response(first, upstream.status, _response_headers(upstream))

    async def relay() -> AsyncIterator[bytes]:
        whole = False
        pending = b""  # the start of an event not yet whole: held back until it is
        try:
            ready, pending = _split_events(first)
            if ready:
                yield ready
            async for chunk in upstream.content.iter_any():
                ready, pending = _split_events(pending + chunk)
                if ready:
                    yield ready
            if pending:
                yield pending
            whole = True
        except _TRANSPORT_ERRORS as error:  # the backend failed mid-stream
            logger.warning("%s failed mid-stream: %s: %s", url, type(error).__name__, error)
            yield _stream_failure(error)
        finally:
            if whole:  # read to its end: the connection goes back to the pool
                upstream.release()
            else:  # abandoned (the client left): closing it aborts the backend's request
                upstream.close()
            on_finished()

    return StreamingResponse(relay(), upstream.status, _response_headers(upstream))
