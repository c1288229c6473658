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

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    with_config,
)
from typing_extensions import NotRequired, TypedDict

MAX_CACHE_SALT_LENGTH = 256
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
"""An integer field the engine holds in 64 bits: beyond that range a 400 names the field (as
vLLM's server and OpenAI answer), instead of an overflow deeper in."""



def checked(**json_schema: Any) -> Any:
    """A constraint the routes check themselves (with a message naming the field and the
    value, e.g. a token id outside the vocabulary), published in the schema as ``json_schema``
    (a pydantic constraint in a union would answer with the first union member's error)."""
    return Field(json_schema_extra=json_schema)


PromptText = Annotated[str, checked(minLength=1)]
TokenId = Annotated[int, checked(minimum=0)]
TokenIds = Annotated[list[TokenId], Field(fail_fast=True, json_schema_extra={"minItems": 1})]
Texts = Annotated[list[PromptText], Field(fail_fast=True, json_schema_extra={"minItems": 1})]
"""Lists inside a union stop at their first wrong item: a union member that cannot match (a
list of ids tried as texts) would otherwise report every item, 20x the cost of the match on
a long list, on the event loop."""

Role = Literal["system", "developer", "user", "assistant", "tool"]
"""The message roles OpenAI's chat API takes; any other role is a 400."""


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
    max_tokens: Annotated[Int64, checked(minimum=1)] | None = None
    temperature: Annotated[float, checked(minimum=0, maximum=100)] = 1.0
    top_p: Annotated[float, checked(exclusiveMinimum=0, maximum=1)] = 1.0
    top_k: Annotated[Int64, checked(minimum=-1, **{"not": {"const": 0}})] = -1  # -1: off
    n: Annotated[Int64, checked(minimum=1)] = 1
    seed: Int64 | None = None
    stop: PromptText | Texts | None = None
    stop_token_ids: list[Annotated[Int64, checked(minimum=0)]] | None = None  # as vLLM's
    include_stop_str_in_output: bool = False
    presence_penalty: Annotated[float, checked(minimum=-2, maximum=2)] = 0.0
    frequency_penalty: Annotated[float, checked(minimum=-2, maximum=2)] = 0.0
    logit_bias: dict[str, Annotated[float, checked(minimum=-100, maximum=100)]] | None = None
    # vLLM's extensions
    repetition_penalty: Annotated[float, checked(exclusiveMinimum=0, maximum=10)] = 1.0
    min_p: Annotated[float, checked(minimum=0, maximum=1)] = 0.0
    min_tokens: Annotated[Int64, checked(minimum=0)] = 0
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    cache_salt: str | None = Field(default=None, max_length=MAX_CACHE_SALT_LENGTH, min_length=1)
    # vLLM's: exactly one of json (a JSON Schema), json_object, regex, choice, grammar (Lark)
    structured_outputs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    """``prompt``: text, token ids, or a list of either (one choice set per prompt).
    ``logprobs``: how many top tokens to report beside each sampled one (0: only it); with
    ``echo``, beside each prompt token too. ``prompt_logprobs`` (vLLM's): the prompt tokens'
    log probabilities and that many top tokens at each position."""

    logprobs: Annotated[Int64, checked(minimum=0, maximum=20)] | None = None
    echo: bool = False
    prompt_logprobs: Annotated[Int64, checked(minimum=0, maximum=20)] | None = None

    prompt: PromptText | Texts | TokenIds | Annotated[
        list[TokenIds], Field(fail_fast=True, json_schema_extra={"minItems": 1})]


@with_config(ConfigDict(strict=True, extra="allow"))
class TextPart(TypedDict):
    """A content part: text is the only kind this server renders."""

    type: Literal["text"]
    text: str


@with_config(ConfigDict(strict=True, extra="allow"))
class ChatMessage(TypedDict):
    """One message; ``content`` is text or a list of parts (text parts are kept). Other keys
    (``name``, ``tool_calls``, ``tool_call_id``...) pass to the chat template. A TypedDict,
    not a model: validated 5x faster (a long conversation is validated on the event loop)."""

    role: Role
    content: NotRequired[str | list[TextPart] | None]


Messages = Annotated[list[ChatMessage], Field(min_length=1)]
"""Chat messages: at least one, wherever a route takes them."""


class NamedFunction(StrictRequest):
    name: str


class NamedToolChoice(StrictRequest):
    """``tool_choice`` naming the function the reply must call."""

    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    messages: Messages
    max_completion_tokens: Annotated[Int64, checked(minimum=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[Int64, checked(minimum=0, maximum=20)] | None = None
    prompt_logprobs: Annotated[Int64, checked(minimum=0, maximum=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}
    response_format: dict[str, Any] | None = None


ONE_OF_PROMPT_OR_MESSAGES = ConfigDict(
    strict=True, extra="ignore",
    json_schema_extra={"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]})
"""Bodies that take exactly one of ``prompt`` and ``messages`` (the routes check it)."""


class TokenizeRequest(StrictRequest):
    """Either ``prompt`` or ``messages`` (rendered with the chat template)."""

    model_config = ONE_OF_PROMPT_OR_MESSAGES
    model: str | None = None
    prompt: str | None = None
    messages: Messages | None = None


class DetokenizeRequest(StrictRequest):
    model: str | None = None
    tokens: list[int]


class CachePromptRequest(StrictRequest):
    """A prefix for the cache routes: ``prompt`` (text or ids) or chat ``messages``."""

    model_config = ONE_OF_PROMPT_OR_MESSAGES
    model: str | None = None
    prompt: PromptText | TokenIds | None = None
    messages: Messages | None = None
    cache_salt: str | None = Field(default=None, max_length=MAX_CACHE_SALT_LENGTH, min_length=1)


class WarmRequest(CachePromptRequest):
    pin: bool = False


# ---------------------------------------------------------------------------- responses
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    """``cache_creation_input_tokens``: prompt tokens this request computed and pinned by its
    ``cache_control`` (Anthropic's field; 0 without one)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)
    cache_creation_input_tokens: int = 0


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int,
               created_tokens: int = 0) -> Usage:  # fmt: skip
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        cache_creation_input_tokens=created_tokens,
    )


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: per token its text, log probability, top alternatives
    (text -> log probability) and character offset in the choice's text."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)  # null: the first token
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)  # of an echo
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's entry for one token at one prompt position."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[str, PromptLogprob] | None]
"""Per prompt position (None for the first): token id (as a string) -> its entry; the prompt's
own token and the top tokens asked for."""


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # the JSON text of the arguments object


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    """Chat's shape: one entry per sampled token."""

    content: list[TokenLogprobEntry] | None = None
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    prompt_logprobs: PromptLogprobs | None = None


class _OmitsNone(BaseModel):
    """A delta that leaves out what it does not carry, as OpenAI streams them: clients merge
    deltas key by key, and a ``null`` would overwrite what an earlier delta set."""

    @model_serializer(mode="wrap")
    def _without_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class FunctionCallDelta(_OmitsNone):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_OmitsNone):
    """A streamed call: its first delta carries ``id``, ``type`` and the name, later ones
    more of the arguments' text (clients join them by ``index``)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChatDelta(BaseModel):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
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
