"""LangChain chat model on a prefixcache SDK client (HTTP ``Client`` or in-process
``LocalClient``): ``invoke`` / ``stream``, with ``usage_metadata`` reporting cached tokens as
``input_token_details.cache_read``.

    from prefixcache.integrations.adapters.langchain_chat import PrefixCacheChatModel
    chat = PrefixCacheChatModel.from_url("http://127.0.0.1:8000", max_tokens=64)
    chat.invoke("Hello")
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    convert_to_openai_messages,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field

from prefixcache.integrations.sdk import Client
from prefixcache.integrations.sdk.results import Usage


def usage_metadata(usage: Usage) -> UsageMetadata:
    """LangChain's usage dict; ``cache_read`` = prompt tokens served from the prefix cache."""
    return UsageMetadata(
        input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        input_token_details={"cache_read": usage.cached_tokens},
    )


class PrefixCacheChatModel(BaseChatModel):
    """Chat model whose calls go through ``client`` (anything with the SDK's ``chat`` and
    ``stream``). Sampling fields left None use the server's defaults."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Any = Field(exclude=True)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    cache_salt: str | None = None

    @classmethod
    def from_url(cls, base_url: str, *, api_key: str | None = None, model: str | None = None,
                 **fields: Any) -> PrefixCacheChatModel:
        """A model talking HTTP to a prefixcache (or OpenAI-compatible) server."""
        return cls(client=Client(base_url, api_key=api_key, model=model), **fields)

    @property
    def _llm_type(self) -> str:
        return "prefixcache"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "seed": self.seed}

    def _options(self, stop: list[str] | None, **kwargs: Any) -> dict[str, Any]:
        options = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                   "top_p": self.top_p, "seed": self.seed, "salt": self.cache_salt,
                   "stop": list(stop or [])}
        options.update(kwargs)
        return options

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        completion = self.client.chat(convert_to_openai_messages(messages),
                                      **self._options(stop, **kwargs))
        message = AIMessage(content=completion.text,
                            usage_metadata=usage_metadata(completion.usage),
                            response_metadata={"finish_reason": completion.finish_reason})
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        for piece in self.client.stream(messages=convert_to_openai_messages(messages),
                                        **self._options(stop, **kwargs)):
            message = AIMessageChunk(
                content=piece.text,
                usage_metadata=usage_metadata(piece.usage) if piece.usage else None,
                response_metadata={"finish_reason": piece.finish_reason}
                if piece.finish_reason else {},
            )
            chunk = ChatGenerationChunk(message=message)
            if run_manager is not None and piece.text:
                run_manager.on_llm_new_token(piece.text, chunk=chunk)
            yield chunk
