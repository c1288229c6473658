"""``/v1/completions`` and ``/v1/chat/completions``: streamed (SSE) or whole responses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from prefixcache.engine.llm import LLM
from prefixcache.engine.outputs import TokenLogprob
from prefixcache.engine.sampling_params import MAX_LOGPROBS
from prefixcache.engine.tool_prompt import tool_functions
from prefixcache.integrations.server import protocol as p
from prefixcache.integrations.server.cache_control import check_pin_budget, pin_requests
from prefixcache.integrations.server.chat_chunks import chat_chunks
from prefixcache.integrations.server.errors import ApiError, bad_request, error_responses
from prefixcache.integrations.server.generation import (
    ChoiceStep,
    prepare,
    stream,
    usage_of,
    whole,
)
from prefixcache.integrations.server.logprobs_wire import (
    chat_logprobs,
    completion_logprobs,
    prompt_logprobs_wire,
)
from prefixcache.integrations.server.openapi_contract import sse_events
from prefixcache.integrations.server.prompt_encoding import (
    encode_prompt,
    encode_prompts,
    render_messages,
)
from prefixcache.integrations.server.state import ServerState, State, resolve_salt
from prefixcache.integrations.server.structured_request import requested_structure
from prefixcache.integrations.server.tool_replies import reply_message
from prefixcache.integrations.server.unsupported import refuse_unsupported

router = APIRouter()
GENERATION_ERRORS = error_responses(400, 404, 413, 429, 500, 503)
STREAM_CHUNKS = (p.CompletionResponse, p.ChatCompletionChunk)  # published with the schema


def _json_or_stream(model: type[BaseModel], chunk: type[BaseModel]) -> dict:
    """The 200 response of a generation route: ``model`` as JSON, or with ``"stream": true``
    an SSE stream of ``data: <chunk>`` events (a last one may be an error body instead),
    ending with ``data: [DONE]``."""
    return {200: {"model": model, "content": {"text/event-stream": {
        "schema": sse_events(chunk)}}}, **GENERATION_ERRORS}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # the OpenAI default for /v1/completions


def _prompt_list(prompt: str | list[str] | list[int] | list[list[int]]) -> list:
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    if not prompt:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    return list(prompt)


def _chat_max_tokens(body: p.ChatCompletionRequest) -> tuple[int | None, str]:
    """The completion length limit and the field it came from: ``max_tokens`` when given,
    else ``max_completion_tokens`` (errors name the field the client sent)."""
    if body.max_tokens is not None:
        return body.max_tokens, "max_tokens"
    return body.max_completion_tokens, "max_completion_tokens"


@router.post("/v1/completions", response_model=None,
             responses=_json_or_stream(p.CompletionResponse, p.CompletionResponse))
async def create_completion(
    body: p.CompletionRequest, request: Request, state: State
) -> p.CompletionResponse | StreamingResponse:
    state.check_model(body.model)
    refuse_unsupported("completions", body.model_extra)
    _check_logprobs(body.logprobs, "logprobs")
    _check_logprobs(body.prompt_logprobs, "prompt_logprobs")
    structured, _ = requested_structure(state, body)
    prompt_list = _prompt_list(body.prompt)
    prompts = await encode_prompts(state, prompt_list, "prompt")
    echo_logprobs = body.echo and body.logprobs is not None
    top = max(body.prompt_logprobs or 0, body.logprobs or 0 if echo_logprobs else 0)
    scored = (await _prompt_logprobs(state, prompts, top)
              if body.prompt_logprobs is not None or echo_logprobs else None)  # fmt: skip
    prepared = prepare(state, request, body, prompts, body.max_tokens,
                       COMPLETIONS_DEFAULT_MAX_TOKENS, structured=structured,
                       logprobs=body.logprobs)  # fmt: skip
    response_id, model = p.new_id("cmpl"), state.model_name
    tokenizer = state.engine.llm.tokenizer
    n = prepared.params.n

    def prompt_wire(i: int) -> p.PromptLogprobs | None:
        if body.prompt_logprobs is None or scored is None:
            return None
        return prompt_logprobs_wire(tokenizer, _top_only(scored[i], body.prompt_logprobs))
    echoed = [(prompt if isinstance(prompt, str) else tokenizer.decode(prompt)) if body.echo
              else "" for prompt in prompt_list]  # fmt: skip
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        sent: dict[int, int] = {}  # choice -> characters sent (the logprobs' text offset)

        def chunks(i: int, step: ChoiceStep) -> list[BaseModel]:
            text = (echoed[i // n] if step.first else "") + step.delta
            logprobs = None
            if body.logprobs is not None:
                echo = (prompts[i // n], scored[i // n]) if echo_logprobs and step.first \
                    and scored else None  # fmt: skip
                logprobs = completion_logprobs(tokenizer, step.logprobs,
                                               sent.get(i, 0) + len(text) - len(step.delta),
                                               echo)  # fmt: skip
            sent[i] = sent.get(i, 0) + len(text)
            return [p.CompletionResponse(id=response_id, model=model, choices=[
                p.CompletionChoice(index=i, text=text, logprobs=logprobs,
                                   finish_reason=step.finish_reason,
                                   prompt_logprobs=prompt_wire(i // n) if step.first
                                   else None)])]  # fmt: skip

        return stream(prepared, include_usage, chunks,
                      lambda usage: p.CompletionResponse(id=response_id, model=model,
                                                         choices=[], usage=usage))
    outputs = await whole(request, prepared)
    choices = []
    for i, output in enumerate(outputs):
        for c in output.outputs:
            echo = (prompts[i], scored[i]) if echo_logprobs and scored else None
            logprobs = None if c.logprobs is None else completion_logprobs(
                tokenizer, c.logprobs, len(echoed[i]), echo)  # fmt: skip
            choices.append(p.CompletionChoice(index=i * n + c.index, text=echoed[i] + c.text,
                                              logprobs=logprobs, finish_reason=c.finish_reason,
                                              prompt_logprobs=prompt_wire(i)))  # fmt: skip
    return p.CompletionResponse(id=response_id, model=model, choices=choices,
                                usage=usage_of(outputs))


@router.post("/v1/chat/completions", response_model=None,
             responses=_json_or_stream(p.ChatCompletionResponse, p.ChatCompletionChunk))
async def create_chat_completion(
    body: p.ChatCompletionRequest, request: Request, state: State
) -> p.ChatCompletionResponse | StreamingResponse:
    state.check_model(body.model)
    refuse_unsupported("chat", body.model_extra)
    _check_logprobs(body.top_logprobs, "top_logprobs")
    _check_logprobs(body.prompt_logprobs, "prompt_logprobs")
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    if body.prompt_logprobs is not None and body.stream:
        raise bad_request("prompt_logprobs is answered in a whole (non-streamed) chat response",
                          param="prompt_logprobs")  # fmt: skip
    parser = _tool_parser(state, body)
    structured, _ = requested_structure(state, body, state.tool_call_parser)
    prompt_text = await render_messages(state, body.messages, body.tools)
    prompts = [await encode_prompt(state, prompt_text, "messages")]
    scored = (None if body.prompt_logprobs is None
              else await _prompt_logprobs(state, prompts, body.prompt_logprobs))  # fmt: skip
    max_tokens, max_tokens_param = _chat_max_tokens(body)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    salt = resolve_salt(request, body.cache_salt)
    pins = await pin_requests(state, body, prompts[0])
    await check_pin_budget(state, salt, pins)
    prepared = prepare(state, request, body, prompts, max_tokens, None, max_tokens_param,
                       structured, logprobs, salt)  # fmt: skip
    prepared.pins = pins
    response_id, model = p.new_id("chatcmpl"), state.model_name
    tokenizer = state.engine.llm.tokenizer
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return stream(
            prepared, include_usage, chat_chunks(response_id, model, parser, tokenizer),
            lambda usage: p.ChatCompletionChunk(id=response_id, model=model, choices=[],
                                                usage=usage),
        )
    outputs = await whole(request, prepared)
    choices = []
    for c in outputs[0].outputs:
        message, finish_reason = reply_message(c.text, parser, c.finish_reason)
        choices.append(p.ChatChoice(
            index=c.index, message=message, finish_reason=finish_reason,
            logprobs=None if c.logprobs is None else chat_logprobs(tokenizer, c.logprobs)))
    return p.ChatCompletionResponse(
        id=response_id, model=model, choices=choices, usage=usage_of(outputs, pins),
        prompt_logprobs=None if scored is None else prompt_logprobs_wire(tokenizer, scored[0]))


async def _prompt_logprobs(state: ServerState, prompts: Sequence[Sequence[int]],
                           top: int) -> list[list[TokenLogprob | None]]:  # fmt: skip
    """Each prompt's token log probabilities, recomputed on the engine's thread (a prefix hit
    never computed them): a prefill's work per prompt, whatever the cache holds."""
    return [await state.engine.call(LLM.prompt_logprobs, list(ids), top) for ids in prompts]


def _top_only(entries: Sequence[TokenLogprob | None], top: int) -> list[TokenLogprob | None]:
    """The entries with ``top`` alternatives each (computed with at least as many)."""
    return [None if e is None else replace(e, top=e.top[:top]) for e in entries]


def _check_logprobs(value: int | None, param: str) -> None:
    if value is not None and not 0 <= value <= MAX_LOGPROBS:
        raise bad_request(f"{param} must be in [0, {MAX_LOGPROBS}], got {value}", param=param)


def _tool_parser(state: ServerState, body: p.ChatCompletionRequest) -> str | None:
    """The parser of this request's replies: None without tools or with ``tool_choice``
    "none" (the reply is text); 400 naming ``tools`` for a tool that is not a function."""
    if not body.tools:
        return None
    try:
        tool_functions(body.tools)
    except ValueError as error:
        raise bad_request(str(error), param="tools") from error
    return None if body.tool_choice == "none" else state.tool_call_parser
