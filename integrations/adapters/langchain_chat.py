"""LangChain chat model on a prefixcache SDK client (HTTP ``Client`` or in-process
``LocalClient``): ``invoke`` / ``stream``, ``bind_tools`` (calls parsed into ``tool_calls``,
streamed as ``tool_call_chunks``), ``with_structured_output`` (function calling, JSON Schema or
JSON mode), and ``usage_metadata`` reporting cached tokens as ``input_token_details.cache_read``.

    from prefixcache.integrations.adapters.langchain_chat import PrefixCacheChatModel
    chat = PrefixCacheChatModel(base_url="http://127.0.0.1:8000", max_tokens=64)
    chat.invoke("Hello")
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    convert_to_openai_messages,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import ConfigDict, Field, model_validator

from prefixcache.integrations.sdk import APIError, Client
from prefixcache.integrations.sdk.results import Completion, Usage

RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
BASE_URL_ENV = "PREFIXCACHE_BASE_URL"
API_KEY_ENV = "PREFIXCACHE_API_KEY"


def usage_metadata(usage: Usage) -> UsageMetadata:
    """LangChain's usage dict; ``cache_read`` = prompt tokens served from the prefix cache."""
    return UsageMetadata(
        input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        input_token_details={"cache_read": usage.cached_tokens},
    )


def ai_message(completion: Completion, model_name: str | None) -> AIMessage:
    """The reply as LangChain's message: text, calls (``invalid_tool_calls`` for arguments
    that are not a JSON object), usage and metadata."""
    calls, invalid = [], []
    for call in completion.tool_calls:
        function = call.get("function") or {}
        try:
            args = json.loads(function.get("arguments") or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments are not an object")
            calls.append(tool_call(name=function.get("name", ""), args=args, id=call.get("id")))
        except ValueError as error:
            invalid.append(invalid_tool_call(name=function.get("name"), id=call.get("id"),
                                             args=function.get("arguments"), error=str(error)))
    return AIMessage(content=completion.text, tool_calls=calls, invalid_tool_calls=invalid,
                     usage_metadata=usage_metadata(completion.usage),
                     response_metadata={"finish_reason": completion.finish_reason,
                                        "model_name": model_name})  # fmt: skip


class PrefixCacheChatModel(BaseChatModel):
    """Chat model whose calls go through ``client`` (anything with the SDK's ``chat`` and
    ``stream``), or through an HTTP ``Client`` built from ``base_url`` / ``api_key`` /
    ``model`` / ``timeout`` (``base_url`` and ``api_key`` default to the environment's
    ``PREFIXCACHE_BASE_URL`` and ``PREFIXCACHE_API_KEY``, as the server reads the key). Sampling
    fields left None use the server's defaults. ``stop``
    joins every call's own stop strings; ``max_retries`` retries a call the server answered
    408, 429 or 5xx (a stream only before its first piece), with exponential backoff."""

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    client: Any = Field(default=None, exclude=True)
    base_url: str | None = None
    api_key: str | None = Field(default=None, exclude=True)
    model_name: str | None = Field(default=None, alias="model")
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    timeout: float | None = None
    max_retries: int = 2
    cache_salt: str | None = None

    @model_validator(mode="after")
    def _client_from_url(self) -> PrefixCacheChatModel:
        if self.client is None:
            self.base_url = self.base_url or os.environ.get(BASE_URL_ENV)
            self.api_key = self.api_key or os.environ.get(API_KEY_ENV)
            if self.base_url is None:
                raise ValueError(f"give a client or a base_url (or set {BASE_URL_ENV})")
            self.client = Client(self.base_url, api_key=self.api_key, model=self.model_name,
                                 timeout=self.timeout or 120.0)  # fmt: skip
        return self

    @classmethod
    def from_url(cls, base_url: str, *, api_key: str | None = None, model: str | None = None,
                 **fields: Any) -> PrefixCacheChatModel:
        """A model talking HTTP to a prefixcache (or OpenAI-compatible) server."""
        return cls(base_url=base_url, api_key=api_key, model=model, **fields)

    @property
    def _llm_type(self) -> str:
        return "prefixcache"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "prefixcache"
        params["ls_model_name"] = kwargs.get("model") or self.model_name or \
            getattr(self.client, "model", "")  # fmt: skip
        return params

    # ------------------------------------------------------------------ tools and structure
    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable | Any], *,
                   tool_choice: str | bool | dict | None = None,
                   parallel_tool_calls: bool | None = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind OpenAI-format tools (any LangChain tool, function or schema); ``tool_choice``
        "auto", "none", "required" ("any" and True mean it too), or a tool's name. A forced
        call ("required") is one call unless ``parallel_tool_calls=True``: the server makes a
        forced reply a grammar of calls, and a small model would go on calling."""
        formatted = [convert_to_openai_tool(tool) for tool in tools]
        if tool_choice in ("any", True):
            tool_choice = "required"
        elif isinstance(tool_choice, str) and tool_choice not in ("auto", "none", "required"):
            tool_choice = {"type": "function", "function": {"name": tool_choice}}
        bound: dict[str, Any] = {"tools": formatted, **kwargs}
        if tool_choice is not None and tool_choice is not False:
            bound["tool_choice"] = tool_choice
        if parallel_tool_calls is None and tool_choice == "required":
            parallel_tool_calls = False
        if parallel_tool_calls is not None:
            bound["parallel_tool_calls"] = parallel_tool_calls
        return self.bind(**bound)

    def with_structured_output(self, schema: dict | type, *, include_raw: bool = False,
                               method: str = "function_calling",
                               **kwargs: Any) -> Runnable[LanguageModelInput, Any]:
        """``method``: "function_calling" (a call to the schema as a tool, the grammar-forced
        way), "json_schema" (``response_format`` with the schema) or "json_mode" (any JSON
        object, parsed)."""
        if method == "function_calling":
            return super().with_structured_output(schema, include_raw=include_raw, **kwargs)
        pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        if method == "json_schema":
            json_schema = convert_to_json_schema(schema)
            name = json_schema.get("title", "output")
            llm = self.bind(response_format={"type": "json_schema", "json_schema": {
                "name": name, "schema": json_schema}}, ls_structured_output_format={
                "kwargs": {"method": method}, "schema": schema})  # fmt: skip
        elif method == "json_mode":
            llm = self.bind(response_format={"type": "json_object"},
                            ls_structured_output_format={"kwargs": {"method": method},
                                                         "schema": schema})  # fmt: skip
        else:
            raise ValueError(f"unknown method {method!r}: function_calling, json_schema or "
                             f"json_mode")  # fmt: skip
        parser = PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=lambda x: parser.invoke(x["raw"]),
                                            parsing_error=lambda _: None)  # fmt: skip
        fallback = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback],
                                                            exception_key="parsing_error")

    # ------------------------------------------------------------------ calls
    def _options(self, stop: list[str] | None, **kwargs: Any) -> dict[str, Any]:
        kwargs.pop("model", None)  # one model a server: a per-call name is only reported
        options = {"max_tokens": self.max_tokens, "temperature": self.temperature,
                   "top_p": self.top_p, "seed": self.seed, "salt": self.cache_salt,
                   "stop": [*(self.stop or []), *(stop or [])]}
        options.update(kwargs)
        return options

    def _retrying(self, call: Callable[[], Any]) -> Any:
        for attempt in range(self.max_retries + 1):
            try:
                return call()
            except APIError as error:
                if error.status not in RETRIED_STATUSES or attempt == self.max_retries:
                    raise
                time.sleep(min(0.5 * 2**attempt, 8.0))
        raise AssertionError("unreachable")

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        openai_messages = convert_to_openai_messages(messages)
        options = self._options(stop, **kwargs)
        completion = self._retrying(lambda: self.client.chat(openai_messages, **options))
        message = ai_message(completion, self.model_name)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        openai_messages = convert_to_openai_messages(messages)
        options = self._options(stop, **kwargs)
        pieces = self._retrying(lambda: _started(self.client.stream(messages=openai_messages,
                                                                    **options)))
        for piece in pieces:
            metadata = {"finish_reason": piece.finish_reason, "model_name": self.model_name} \
                if piece.finish_reason else {}  # fmt: skip
            chunks = [tool_call_chunk(name=d.get("function", {}).get("name"),
                                      args=d.get("function", {}).get("arguments"),
                                      id=d.get("id"), index=d.get("index"))
                      for d in piece.tool_calls]  # fmt: skip
            message = AIMessageChunk(
                content=piece.text, tool_call_chunks=chunks,
                usage_metadata=usage_metadata(piece.usage) if piece.usage else None,
                response_metadata=metadata,
            )
            chunk = ChatGenerationChunk(message=message)
            if run_manager is not None and piece.text:
                run_manager.on_llm_new_token(piece.text, chunk=chunk)
            yield chunk


def _started(pieces: Iterator[Any]) -> Iterator[Any]:
    """``pieces`` with its first item already taken (so an error before it raises here,
    where a retry may still be made)."""
    first = next(pieces, None)
    return iter([]) if first is None else _chain(first, pieces)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest
