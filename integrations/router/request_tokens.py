"""The prompt token ids of an OpenAI request, counted as its backend will count them.

With a local ``PromptTokenizer`` (``router --tokenizer MODEL``) the router tokenizes itself
(long text on a worker thread, resent pieces from its cache); without one it asks a healthy
backend's ``/tokenize``. Anything that cannot be counted (malformed JSON, an unknown shape, a
failed ``/tokenize``) gives None: the request is still routed, by load alone, and the backend
answers it, errors included, as it would directly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from prefixcache.integrations.router.backend_pool import BackendPool
from prefixcache.integrations.router.prompt_tokenizer import PromptTokenizer

logger = logging.getLogger(__name__)

THREAD_CHARS = 8192  # text longer than this is tokenized off the event loop


class RequestTokens:
    def __init__(self, tokenizer: PromptTokenizer | None, pool: BackendPool) -> None:
        self.tokenizer = tokenizer
        self.pool = pool

    async def prompt_ids(self, path: str, body: Any) -> list[int] | None:
        if not isinstance(body, Mapping):
            return None
        try:
            if path.endswith("/chat/completions"):
                return await self._chat(body)
            return await self._completion(body)
        except (ValueError, TypeError, KeyError) as error:
            logger.debug("cannot count the prompt's tokens: %s", error)
            return None

    async def _completion(self, body: Mapping[str, Any]) -> list[int] | None:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
            prompt = prompt[0]  # a batch: route by its first prompt
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if not isinstance(prompt, str):
            return None
        if self.tokenizer is None:
            return await self._remote({"model": body.get("model"), "prompt": prompt})
        return await self._local(len(prompt), self.tokenizer.completion_ids, prompt)

    async def _chat(self, body: Mapping[str, Any]) -> list[int] | None:
        messages, tools = body.get("messages"), body.get("tools")
        if not isinstance(messages, list):
            return None
        if self.tokenizer is None:
            return await self._remote({"model": body.get("model"), "messages": messages})
        size = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, Mapping))
        return await self._local(size, self.tokenizer.chat_ids, messages, tools)

    async def _local(self, size: int, function: Any, *args: Any) -> list[int]:
        if size > THREAD_CHARS:
            return await asyncio.to_thread(function, *args)
        return function(*args)

    async def _remote(self, payload: dict[str, Any]) -> list[int] | None:
        for backend in self.pool.backends:
            if not backend.healthy:
                continue
            try:
                response = await self.pool.client.post(f"{backend.url}/tokenize", json=payload,
                                                       timeout=10)  # fmt: skip
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                tokens = response.json().get("tokens")
                return tokens if isinstance(tokens, list) else None
            return None  # the backend refuses it: it will refuse the request too
        return None
