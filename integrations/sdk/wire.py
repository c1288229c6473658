"""HTTP details shared by ``Client`` and ``AsyncClient``: bodies, SSE parsing, errors."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

from prefixcache.integrations.sdk.options import GenerationOptions
from prefixcache.integrations.sdk.results import Chunk, Usage

Messages = Sequence[Mapping[str, Any]]
DONE = "[DONE]"


class APIError(RuntimeError):
    """A non-2xx answer; fields from the OpenAI-style error body when there is one."""

    def __init__(self, status: int, message: str, error_type: str | None = None,
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message
        self.error_type, self.param, self.code = error_type, param, code


class APITimeoutError(APIError):
    """No answer within the client's timeout (status 408: the request may still be running
    on the server; a stream closed by it is aborted there)."""

    def __init__(self, message: str) -> None:
        super().__init__(408, message, "timeout")


@contextlib.contextmanager
def timeouts_as_api_errors() -> Iterator[None]:
    """httpx's timeouts (connect, read, write, pool) raised as ``APITimeoutError``."""
    try:
        yield
    except httpx.TimeoutException as error:
        raise APITimeoutError(f"no answer within the client's timeout: {error!r}") from error


def raise_for_error(response: httpx.Response) -> None:
    """Raise ``APIError`` unless the (already read) response is 2xx."""
    if response.is_success:
        return
    try:
        error = response.json()["error"]
        raise APIError(response.status_code, error.get("message", ""), error.get("type"),
                       error.get("param"), error.get("code"))
    except (ValueError, KeyError, TypeError):
        raise APIError(response.status_code, response.text) from None


def completion_body(model: str, prompt: str | Sequence[int], options: GenerationOptions,
                    stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": prompt, **options.openai_fields()}
    return _with_stream(body, stream)


def chat_body(model: str, messages: Messages, options: GenerationOptions,
              stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [dict(m) for m in messages],
                            **options.openai_fields()}
    return _with_stream(body, stream)


def prefix_body(prompt: str | Sequence[int] | None, messages: Messages | None,
                salt: str | None, **extra: Any) -> dict[str, Any]:
    """Body of the cache routes: exactly one of ``prompt`` / ``messages``."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt or messages")
    body: dict[str, Any] = {"prompt": prompt} if messages is None else {
        "messages": [dict(m) for m in messages]}
    if salt is not None:
        body["cache_salt"] = salt
    return {**body, **extra}


def _with_stream(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


# The status each OpenAI error ``type`` has when a prefixcache server answers it as a whole
# response (``ERROR_TYPES`` in integrations/server/errors.py, read backwards; 405 and 413 are
# also "invalid_request_error", 400 is its usual status). An error that happens mid-stream
# arrives as an SSE event after the 200 status line, so its status is recovered from this.
ERROR_TYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "not_found_error": 404,
    "rate_limit_error": 429,
    "server_error": 500,
    "service_unavailable": 503,
}


def error_event_status(error: Mapping[str, Any]) -> int:
    """The HTTP status of the error body in a stream event: an integer ``code`` that is an
    HTTP error status (the form some OpenAI-compatible servers use) if there is one, else the
    status of its ``type``, else 500."""
    code = error.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code
    return ERROR_TYPE_STATUS.get(error.get("type"), 500)


def parse_event(line: str) -> dict[str, Any] | str | None:
    """One SSE line -> its JSON payload, ``DONE``, or None (blank lines, comments). An error
    event raises ``APIError`` with the status the same error has on a whole response."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == DONE:
        return DONE
    payload = json.loads(data)
    if "error" in payload:
        error = payload["error"]
        raise APIError(error_event_status(error), error.get("message", ""), error.get("type"),
                       error.get("param"), error.get("code"))
    return payload


def chunk_from_event(payload: dict[str, Any]) -> Chunk | None:
    """The piece of choice 0 (or the usage) an event carries; None for other choices."""
    usage = Usage.from_openai(payload["usage"]) if payload.get("usage") else None
    for choice in payload.get("choices") or []:
        if choice.get("index", 0) != 0:
            continue
        text = choice.get("text")
        delta = choice.get("delta") or {}
        if text is None:
            text = delta.get("content") or ""
        return Chunk(text, choice.get("finish_reason"), usage, list(delta.get("tool_calls") or []))
    return Chunk("", None, usage) if usage is not None else None


class StreamAssembler:
    """The SSE lines of a streamed response -> the ``Chunk``s ``LocalClient.stream`` yields:
    choice 0's new text as it comes (empty pieces skipped), then one last chunk holding choice
    0's final piece, its finish reason and the usage.

    The piece that finishes choice 0 is held back until the stream ends (the usage event comes
    just before ``[DONE]``) so that it and the usage are one chunk. Each finish reason is
    reported once: what the stream says about choice 0 after it finished (a repeated finish
    event) is ignored, except the usage.
    """

    def __init__(self) -> None:
        self.done = False
        self._final: Chunk | None = None
        self._usage: Usage | None = None

    def feed(self, line: str) -> list[Chunk]:
        """The chunks that ``line`` releases; sets ``done`` at ``[DONE]``. An error event raises
        ``APIError`` (see ``parse_event``)."""
        event = parse_event(line)
        if event == DONE:
            return self.close()
        chunk = chunk_from_event(event) if isinstance(event, dict) else None
        if chunk is None:
            return []
        if chunk.usage is not None:
            self._usage = chunk.usage
        if self._final is not None:
            return []
        if chunk.finish_reason is not None:
            self._final = Chunk(chunk.text, chunk.finish_reason, None, chunk.tool_calls)
            return []
        return [Chunk(chunk.text, tool_calls=chunk.tool_calls)] if chunk.text or \
            chunk.tool_calls else []  # fmt: skip

    def close(self) -> list[Chunk]:
        """The held-back last chunk (none if nothing finished and no usage came); call once the
        stream has ended, with or without ``[DONE]`` (a second call returns nothing)."""
        self.done = True
        final, usage = self._final, self._usage
        self._final = self._usage = None
        if final is None:
            return [] if usage is None else [Chunk("", None, usage)]
        return [Chunk(final.text, final.finish_reason, usage, final.tool_calls)]
