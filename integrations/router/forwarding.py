"""Forwarding one request to one backend, committing only once the backend has answered.

``open_response`` returns the client's response only after the backend sent its status and,
for a stream, its first chunk; until then any failure raises ``BackendUnavailable`` and the
router may try another backend with nothing sent to the client, so a request is never lost
or answered twice. Bytes pass through unchanged, chunk by chunk, status and headers too;
a client that disconnects closes the backend's stream (which aborts the request there).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping

import httpx
from starlette.responses import Response, StreamingResponse

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


def _response_headers(response: httpx.Response) -> dict[str, str]:
    """The backend's headers a client should see, plus which backend answered."""
    kept = passed_on_headers(response.headers.items())
    kept[ROUTED_TO_HEADER] = f"{response.request.url.scheme}://{response.request.url.netloc.decode()}"
    return kept


async def open_response(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    on_started: Callable[[], None],
    on_finished: Callable[[], None],
) -> Response:
    """The client's response from ``url``. ``on_started`` runs once the backend answered
    (first chunk), ``on_finished`` once its answer is fully passed on or abandoned; neither
    runs when BackendUnavailable is raised."""
    request = client.build_request("POST", url, content=body, headers=forward_headers(headers))
    try:
        upstream = await client.send(request, stream=True)
    except httpx.TransportError as error:
        raise BackendUnavailable(f"{type(error).__name__}: {error}", transport=True) from None
    streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")
    try:
        if upstream.status_code in RETRY_STATUSES:
            await upstream.aread()
            raise BackendUnavailable(f"answered {upstream.status_code}", transport=False)
        chunks = upstream.aiter_raw()
        if streaming:
            first = await anext(chunks, b"")
        else:  # read whole before committing: a backend dying mid-body can still be retried
            first = b"".join([chunk async for chunk in chunks])
    except httpx.TransportError as error:
        await upstream.aclose()
        raise BackendUnavailable(f"{type(error).__name__}: {error}", transport=True) from None
    except BaseException:
        await upstream.aclose()
        raise
    on_started()
    if not streaming:
        await upstream.aclose()
        on_finished()
        return Response(first, upstream.status_code, _response_headers(upstream))

    async def relay() -> AsyncIterator[bytes]:
        try:
            if first:
                yield first
            async for chunk in chunks:
                yield chunk
        finally:
            await upstream.aclose()
            on_finished()

    return StreamingResponse(relay(), upstream.status_code, _response_headers(upstream))
