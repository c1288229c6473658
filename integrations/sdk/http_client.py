"""``Client``: the SDK over HTTP (httpx) for a prefixcache server or any OpenAI-compatible one.

``complete`` / ``chat`` / ``stream`` work against any OpenAI-compatible server; ``warm``,
``pin``, ``unpin``, ``lookup``, ``stats`` and ``reset`` need a prefixcache server.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from prefixcache.integrations.sdk import wire
from prefixcache.integrations.sdk.options import GenerationOptions
from prefixcache.integrations.sdk.results import Chunk, Completion


class Client:
    """Synchronous client. ``model`` None: the first model the server lists."""

    def __init__(self, base_url: str, *, api_key: str | None = None, model: str | None = None,
                 timeout: float = 120.0, http: httpx.Client | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = http or httpx.Client(base_url=base_url.rstrip("/"), headers=headers,
                                          timeout=timeout)
        self._model = model

    @property
    def model(self) -> str:
        if self._model is None:
            self._model = self._get("/v1/models")["data"][0]["id"]
        return self._model

    # ------------------------------------------------------------------ generation
    def complete(self, prompt: str | Sequence[int], **options: Any) -> Completion:
        """One completion of ``prompt`` (text or token ids); options: GenerationOptions."""
        body = wire.completion_body(self.model, prompt, GenerationOptions(**options), False)
        return Completion.from_openai(self._post("/v1/completions", body))

    def chat(self, messages: wire.Messages, **options: Any) -> Completion:
        """A reply to OpenAI-style ``messages``."""
        body = wire.chat_body(self.model, messages, GenerationOptions(**options), False)
        return Completion.from_openai(self._post("/v1/chat/completions", body))

    def stream(self, prompt: str | Sequence[int] | None = None, *,
               messages: wire.Messages | None = None, **options: Any) -> Iterator[Chunk]:
        """Text pieces of choice 0 as they are generated (``messages``: chat), the sequence
        ``LocalClient.stream`` yields: only the last chunk has a finish reason, and the usage.
        Closing the iterator early closes the connection, which aborts the request on the
        server. An error reported mid-stream raises ``APIError`` with the status it has on a
        whole response (503 for a stopped engine)."""
        opts = GenerationOptions(**options)
        if messages is not None:
            route, body = "/v1/chat/completions", wire.chat_body(self.model, messages, opts, True)
        elif prompt is not None:
            route, body = "/v1/completions", wire.completion_body(self.model, prompt, opts, True)
        else:
            raise ValueError("give a prompt or messages")
        with wire.timeouts_as_api_errors(), \
                self._http.stream("POST", route, json=body) as response:  # fmt: skip
            if not response.is_success:
                response.read()
                wire.raise_for_error(response)
            assembler = wire.StreamAssembler()
            for line in response.iter_lines():
                yield from assembler.feed(line)
                if assembler.done:
                    return
            yield from assembler.close()

    # ------------------------------------------------------------------ cache control
    def warm(self, prompt: str | Sequence[int] | None = None, *,
             messages: wire.Messages | None = None, pin: bool = False,
             salt: str | None = None) -> int:
        """Prefill a prefix (optionally pin it); returns its cached tokens afterwards."""
        body = wire.prefix_body(prompt, messages, salt, pin=pin)
        return self._post("/v1/cache/warm", body)["cached_tokens"]

    def pin(self, prompt: str | Sequence[int] | None = None, *,
            messages: wire.Messages | None = None, salt: str | None = None) -> int:
        """Pin the cached part of a prefix; returns the pinned tokens."""
        return self._post("/v1/cache/pin", wire.prefix_body(prompt, messages, salt))[
            "pinned_tokens"]

    def unpin(self, prompt: str | Sequence[int] | None = None, *,
              messages: wire.Messages | None = None, salt: str | None = None) -> None:
        self._post("/v1/cache/unpin", wire.prefix_body(prompt, messages, salt))

    def lookup(self, prompt: str | Sequence[int] | None = None, *,
               messages: wire.Messages | None = None, salt: str | None = None) -> int:
        """Leading tokens of a prefix cached now (changes nothing)."""
        return self._post("/v1/cache/lookup", wire.prefix_body(prompt, messages, salt))[
            "cached_tokens"]

    def stats(self) -> dict[str, Any]:
        return self._get("/v1/cache/stats")

    def reset(self) -> int:
        """Evict every evictable cached block; returns how many."""
        return self._post("/v1/cache/reset", {})["evicted_blocks"]

    # ------------------------------------------------------------------ plumbing
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with wire.timeouts_as_api_errors():
            response = self._http.post(path, json=body)
        wire.raise_for_error(response)
        return response.json()

    def _get(self, path: str) -> dict[str, Any]:
        with wire.timeouts_as_api_errors():
            response = self._http.get(path)
        wire.raise_for_error(response)
        return response.json()
