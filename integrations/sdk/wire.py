"""HTTP details shared by ``Client`` and ``AsyncClient``: bodies, SSE parsing, errors."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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


def parse_event(line: str) -> dict[str, Any] | str | None:
    """One SSE line -> its JSON payload, ``DONE``, or None (blank lines, comments)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == DONE:
        return DONE
    payload = json.loads(data)
    if "error" in payload:
        error = payload["error"]
        raise APIError(500, error.get("message", ""), error.get("type"), error.get("param"),
                       error.get("code"))
    return payload


def chunk_from_event(payload: dict[str, Any]) -> Chunk | None:
    """The piece of choice 0 (or the usage) an event carries; None for other choices."""
    usage = Usage.from_openai(payload["usage"]) if payload.get("usage") else None
    for choice in payload.get("choices") or []:
        if choice.get("index", 0) != 0:
            continue
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or {}).get("content") or ""
        return Chunk(text, choice.get("finish_reason"), usage)
    return Chunk("", None, usage) if usage is not None else None


def with_finish_reason(chunk: Chunk, finish_reason: str | None) -> Chunk:
    """The usage-only chunk that ends a stream carries the finish reason seen before it."""
    if chunk.usage is not None and chunk.finish_reason is None and finish_reason is not None:
        return Chunk(chunk.text, finish_reason, chunk.usage)
    return chunk
