"""A cap on request body size, answered 413 in the OpenAI error shape, sized from the model.

Without one, a client can make the server read, parse and hold an arbitrarily large body
before any check on its prompt runs. The default cap leaves room for ``BODY_FULL_PROMPTS``
worst-case prompts: ``max_model_len`` tokens each, every token the longest the vocabulary
has (``UNKNOWN_TOKEN_BYTES`` assumed where the tokenizer gives no bound), every byte written
as the longest JSON escape. With byte-level BPE no single prompt that fits the context can
outgrow it, only a batch of more than that many such prompts; ``build_app(max_body_bytes=)``
sets another cap.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prefixcache.engine.tokenizer import Tokenizer
from prefixcache.integrations.server.errors import BodyTooLarge, body_too_large, error_response

JSON_BYTES_PER_TEXT_BYTE = 6  # the longest JSON escape of one UTF-8 byte: "\u0001"
UNKNOWN_TOKEN_BYTES = 64  # assumed for tokenizers with no sound bound (not byte-level BPE)
BODY_FULL_PROMPTS = 16  # worst-case full-context prompts one body may carry
MIN_BODY_BYTES = 1 << 20  # never below 1 MiB (chat templates, tools, token-id lists)


def default_max_body_bytes(max_model_len: int, tokenizer: Tokenizer) -> int:
    """The default cap: ``BODY_FULL_PROMPTS`` prompts of ``max_model_len`` tokens, each as
    many bytes as the longest token covers, each byte JSON-escaped; at least 1 MiB."""
    token_bytes = tokenizer.max_token_bytes or UNKNOWN_TOKEN_BYTES
    per_prompt = max_model_len * token_bytes * JSON_BYTES_PER_TEXT_BYTE
    return max(MIN_BODY_BYTES, BODY_FULL_PROMPTS * per_prompt)


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
