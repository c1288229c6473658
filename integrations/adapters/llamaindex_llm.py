"""LlamaIndex LLM on a prefixcache SDK client: ``complete`` / ``chat`` and their streaming
forms; ``raw`` of each response holds the SDK ``Usage`` (``cached_tokens`` included). A
``FunctionCallingLLM``: ``chat_with_tools`` / ``predict_and_call`` and LlamaIndex's function
calling agents get the model's calls parsed by the server (``tool_required`` forces one).

    from prefixcache.integrations.adapters.llamaindex_llm import PrefixCacheLLM
    llm = PrefixCacheLLM.from_url("http://127.0.0.1:8000", max_tokens=64)
    llm.complete("Hello")
"""

from __future__ import annotations

import json
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
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from pydantic import ConfigDict, Field

from prefixcache.integrations.sdk import Client
from prefixcache.integrations.sdk.results import Usage

# The keywords ``complete`` / ``chat`` and their streaming forms take, each overriding the
# field of the same name for one call (``salt``: ``cache_salt``); the SDK clients honour all.
CALL_OPTIONS = ("max_tokens", "temperature", "top_p", "seed", "stop", "salt", "tools",
                "tool_choice", "parallel_tool_calls", "response_format", "structured_outputs")


def _raw(usage: Usage | None, finish_reason: str | None) -> dict[str, Any]:
    if usage is None:
        return {"finish_reason": finish_reason}
    return {"finish_reason": finish_reason, "usage": {
        "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens}}


class PrefixCacheLLM(FunctionCallingLLM, CustomLLM):
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
                           is_function_calling_model=True, model_name=self.model_name)

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
        extra = {"tool_calls": completion.tool_calls} if completion.tool_calls else {}
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=completion.text,
                                additional_kwargs=extra),
            raw=_raw(completion.usage, completion.finish_reason))

    # ------------------------------------------------------------------ function calling
    def _prepare_chat_with_tools(self, tools: Sequence[Any], user_msg: str | ChatMessage | None
                                 = None, chat_history: list[ChatMessage] | None = None,
                                 verbose: bool = False, allow_parallel_tool_calls: bool = False,
                                 tool_required: bool = False, **kwargs: Any) -> dict[str, Any]:
        """``chat`` keywords for a call with ``tools`` (LlamaIndex ``BaseTool``s)."""
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(user_msg if isinstance(user_msg, ChatMessage)
                            else ChatMessage(role=MessageRole.USER, content=user_msg))
        prepared = {"messages": messages,
                    "tools": [tool.metadata.to_openai_tool() for tool in tools],
                    "tool_choice": "required" if tool_required else "auto",
                    "parallel_tool_calls": allow_parallel_tool_calls, **kwargs}  # fmt: skip
        return prepared if tools else {"messages": messages, **kwargs}

    def get_tool_calls_from_response(self, response: ChatResponse,
                                     error_on_no_tool_call: bool = True,
                                     **kwargs: Any) -> list[ToolSelection]:
        """The reply's calls; ValueError when it has none and ``error_on_no_tool_call``, or
        when a call's arguments are not a JSON object."""
        calls = response.message.additional_kwargs.get("tool_calls") or []
        if not calls and error_on_no_tool_call:
            raise ValueError(f"expected at least one tool call, got {len(calls)}")
        selections = []
        for call in calls:
            function = call.get("function") or {}
            arguments = json.loads(function.get("arguments") or "{}")
            if not isinstance(arguments, dict):
                raise ValueError(f"tool call arguments must be an object, got {arguments!r}")
            selections.append(ToolSelection(tool_id=call.get("id") or "",
                                            tool_name=function.get("name", ""),
                                            tool_kwargs=arguments))  # fmt: skip
        return selections

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        options = self._options(**kwargs)  # a bad keyword raises here, not when iterated

        def pieces() -> ChatResponseGen:
            text, calls = "", _CallAssembler()
            for piece in self.client.stream(messages=_as_dicts(messages), **options):
                text += piece.text
                calls.add(piece.tool_calls)
                extra = {"tool_calls": calls.calls()} if calls else {}
                yield ChatResponse(
                    message=ChatMessage(role=MessageRole.ASSISTANT, content=text,
                                        additional_kwargs=extra),
                    delta=piece.text, raw=_raw(piece.usage, piece.finish_reason))
        return pieces()


class _CallAssembler:
    """Streamed call deltas (OpenAI's, by ``index``) joined into whole calls."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def add(self, deltas: Sequence[dict[str, Any]]) -> None:
        for delta in deltas:
            call = self._calls.setdefault(delta.get("index", 0), {
                "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
            call["id"] = delta.get("id") or call["id"]
            function = delta.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""

    def calls(self) -> list[dict[str, Any]]:
        return [self._calls[index] for index in sorted(self._calls)]


def _as_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI-style messages: an assistant's calls (``additional_kwargs["tool_calls"]``) and a
    tool result's ``tool_call_id`` kept."""
    dicts = []
    for message in messages:
        entry: dict[str, Any] = {"role": message.role.value, "content": message.content or ""}
        extra = message.additional_kwargs or {}
        if extra.get("tool_calls"):
            entry["tool_calls"] = extra["tool_calls"]
        if extra.get("tool_call_id"):
            entry["tool_call_id"] = extra["tool_call_id"]
        dicts.append(entry)
    return dicts
