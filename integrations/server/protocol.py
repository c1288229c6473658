"""OpenAI wire format (the subset this server speaks), as strict pydantic models.

Requests are validated strictly (``"5"`` is not an int) so a wrong type answers 400 instead of
being coerced; unknown fields are ignored, as OpenAI-compatible servers usually do, except the
OpenAI fields the server does not honour (``unsupported.py``: refused, 400). Response
models always carry ``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_CACHE_SALT_LENGTH = 256


class StrictRequest(BaseModel):
    """Base of every request body: strict types, extra fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(StrictRequest):
    include_usage: bool = False


class SamplingFields(StrictRequest):
    """Fields shared by /v1/completions and /v1/chat/completions. Fields not declared are
    kept in ``model_extra``, where the routes refuse those they do not honour (unsupported.py)."""

    model_config = ConfigDict(strict=True, extra="allow")
    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # as vLLM's server takes them
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    cache_salt: str | None = Field(default=None, max_length=MAX_CACHE_SALT_LENGTH, min_length=1)


class CompletionRequest(SamplingFields):
    """``prompt``: text, token ids, or a list of either (one choice set per prompt)."""

    prompt: str | list[str] | list[int] | list[list[int]]


class ChatMessage(BaseModel):
    """One message; ``content`` is text or a list of parts (text parts are kept)."""

    model_config = ConfigDict(strict=True, extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


Messages = Annotated[list[ChatMessage], Field(min_length=1)]
"""Chat messages: at least one, wherever a route takes them."""


class ChatCompletionRequest(SamplingFields):
    messages: Messages
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None


class TokenizeRequest(StrictRequest):
    """Either ``prompt`` or ``messages`` (rendered with the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: Messages | None = None


class DetokenizeRequest(StrictRequest):
    model: str | None = None
    tokens: list[int]


class CachePromptRequest(StrictRequest):
    """A prefix for the cache routes: ``prompt`` (text or ids) or chat ``messages``."""

    model: str | None = None
    prompt: str | list[int] | None = None
    messages: Messages | None = None
    cache_salt: str | None = Field(default=None, max_length=MAX_CACHE_SALT_LENGTH, min_length=1)


class WarmRequest(CachePromptRequest):
    pin: bool = False


# ---------------------------------------------------------------------------- responses
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


def new_id(prefix: str) -> str:
    """A unique response id such as ``cmpl-3f2a...``."""
    return f"{prefix}-{uuid.uuid4().hex}"
