"""``AsyncClient``: the same interface as ``Client`` for asyncio code (httpx.AsyncClient)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from prefixcache.integrations.sdk import wire
from prefixcache.integrations.sdk.options import GenerationOptions
from prefixcache.integrations.sdk.results import Chunk, Completion


class AsyncClient:
    """Asynchronous client; every method of ``Client`` as a coroutine (``stream``: an async
    iterator). ``model`` None: the first model the server lists."""

    def __init__(self, base_url: str, *, api_key: str | None = None, model: str | None = None,
                 timeout: float = 120.0, http: httpx.AsyncClient | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = http or httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers,
                                               timeout=timeout)
        self._model = model

    async def model(self) -> str:
        if self._model is None:
            self._model = (await self._get("/v1/models"))["data"][0]["id"]
        return self._model

    async def complete(self, prompt: str | Sequence[int], **options: Any) -> Completion:
        body = wire.completion_body(await self.model(), prompt, GenerationOptions(**options),
                                    False)
        return Completion.from_openai(await self._post("/v1/completions", body))

    async def chat(self, messages: wire.Messages, **options: Any) -> Completion:
        body = wire.chat_body(await self.model(), messages, GenerationOptions(**options), False)
        return Completion.from_openai(await self._post("/v1/chat/completions", body))

    async def stream(self, prompt: str | Sequence[int] | None = None, *,
                     messages: wire.Messages | None = None,
                     **options: Any) -> AsyncIterator[Chunk]:
        opts, model = GenerationOptions(**options), await self.model()
        if messages is not None:
            route, body = "/v1/chat/completions", wire.chat_body(model, messages, opts, True)
        elif prompt is not None:
            route, body = "/v1/completions", wire.completion_body(model, prompt, opts, True)
        else:
            raise ValueError("give a prompt or messages")
        with wire.timeouts_as_api_errors():
            async with self._http.stream("POST", route, json=body) as response:
                if not response.is_success:
                    await response.aread()
                    wire.raise_for_error(response)
                assembler = wire.StreamAssembler()
                async for line in response.aiter_lines():
                    for chunk in assembler.feed(line):
                        yield chunk
                    if assembler.done:
                        return
                for chunk in assembler.close():
                    yield chunk

    async def warm(self, prompt: str | Sequence[int] | None = None, *,
                   messages: wire.Messages | None = None, pin: bool = False,
                   salt: str | None = None) -> int:
        body = wire.prefix_body(prompt, messages, salt, pin=pin)
        return (await self._post("/v1/cache/warm", body))["cached_tokens"]

    async def pin(self, prompt: str | Sequence[int] | None = None, *,
                  messages: wire.Messages | None = None, salt: str | None = None) -> int:
        body = wire.prefix_body(prompt, messages, salt)
        return (await self._post("/v1/cache/pin", body))["pinned_tokens"]

    async def unpin(self, prompt: str | Sequence[int] | None = None, *,
                    messages: wire.Messages | None = None, salt: str | None = None) -> None:
        await self._post("/v1/cache/unpin", wire.prefix_body(prompt, messages, salt))

    async def lookup(self, prompt: str | Sequence[int] | None = None, *,
                     messages: wire.Messages | None = None, salt: str | None = None) -> int:
        body = wire.prefix_body(prompt, messages, salt)
        return (await self._post("/v1/cache/lookup", body))["cached_tokens"]

    async def stats(self) -> dict[str, Any]:
        return await self._get("/v1/cache/stats")

    async def reset(self) -> int:
        return (await self._post("/v1/cache/reset", {}))["evicted_blocks"]

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with wire.timeouts_as_api_errors():
            response = await self._http.post(path, json=body)
        wire.raise_for_error(response)
        return response.json()

    async def _get(self, path: str) -> dict[str, Any]:
        with wire.timeouts_as_api_errors():
            response = await self._http.get(path)
        wire.raise_for_error(response)
        return response.json()
