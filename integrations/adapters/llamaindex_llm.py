"""LlamaIndex LLM on a prefixcache SDK client: ``complete`` / ``chat`` and their streaming
forms; ``raw`` of each response holds the SDK ``Usage`` (``cached_tokens`` included).

    from prefixcache.integrations.adapters.llamaindex_llm import PrefixCacheLLM
    llm = PrefixCacheLLM.from_url("http://127.0.0.1:8000", max_tokens=64)
    llm.complete("Hello")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from pydantic import ConfigDict, Field

from prefixcache.integrations.sdk import Client
from prefixcache.integrations.sdk.results import Usage

# The keywords ``complete`` / ``chat`` and their streaming forms take, each overriding the
# field of the same name for one call (``salt``: ``cache_salt``); the SDK clients honour all.
CALL_OPTIONS = ("max_tokens", "temperature", "top_p", "seed", "stop", "salt")


def _raw(usage: Usage | None, finish_reason: str | None) -> dict[str, Any]:
    if usage is None:
        return {"finish_reason": finish_reason}
    return {"finish_reason": finish_reason, "usage": {
        "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens}}


class PrefixCacheLLM(CustomLLM):
    """LlamaIndex LLM whose calls go through ``client`` (``Client`` or ``LocalClient``).

    Sampling fields left None use the server's defaults. Each call may override them with the
    keywords in ``CALL_OPTIONS`` (``stop``: a string or a list of strings); any other keyword
    raises TypeError rather than being silently ignored."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Any = Field(exclude=True)
    model_name: str = "prefixcache"
    context_window: int = 8192
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    cache_salt: str | None = None

    @classmethod
    def from_url(cls, base_url: str, *, api_key: str | None = None, model: str | None = None,
                 **fields: Any) -> PrefixCacheLLM:
        client = Client(base_url, api_key=api_key, model=model)
        return cls(client=client, model_name=model or client.model, **fields)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(context_window=self.context_window,
                           num_output=self.max_tokens or 256, is_chat_model=True,
                           model_name=self.model_name)

    def _options(self, **kwargs: Any) -> dict[str, Any]:
        """The SDK options of one call: the fields, overridden by ``kwargs`` (TypeError for a
        keyword not in ``CALL_OPTIONS``: the call could not honour it)."""
        unsupported = sorted(set(kwargs) - set(CALL_OPTIONS))
        if unsupported:
            raise TypeError(f"PrefixCacheLLM does not support the keyword(s) "
                            f"{', '.join(unsupported)}; supported: {', '.join(CALL_OPTIONS)}")
        options = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                   "top_p": self.top_p, "seed": self.seed, "salt": self.cache_salt}
        options.update(kwargs)
        return options

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                 ) -> CompletionResponse:
        completion = self.client.complete(prompt, **self._options(**kwargs))
        return CompletionResponse(text=completion.text,
                                  raw=_raw(completion.usage, completion.finish_reason))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> CompletionResponseGen:
        options = self._options(**kwargs)  # a bad keyword raises here, not when iterated

        def pieces() -> CompletionResponseGen:
            text = ""
            for piece in self.client.stream(prompt, **options):
                text += piece.text
                yield CompletionResponse(text=text, delta=piece.text,
                                         raw=_raw(piece.usage, piece.finish_reason))
        return pieces()

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        completion = self.client.chat(_as_dicts(messages), **self._options(**kwargs))
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=completion.text),
            raw=_raw(completion.usage, completion.finish_reason))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        options = self._options(**kwargs)  # a bad keyword raises here, not when iterated

        def pieces() -> ChatResponseGen:
            text = ""
            for piece in self.client.stream(messages=_as_dicts(messages), **options):
                text += piece.text
                yield ChatResponse(
                    message=ChatMessage(role=MessageRole.ASSISTANT, content=text),
                    delta=piece.text, raw=_raw(piece.usage, piece.finish_reason))
        return pieces()


def _as_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    return [{"role": message.role.value, "content": message.content or ""}
            for message in messages]
