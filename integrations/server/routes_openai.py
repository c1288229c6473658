"""``/v1/completions`` and ``/v1/chat/completions``: streamed (SSE) or whole responses."""

from __future__ import annotations

import json
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from prefixcache.engine.outputs import RequestOutput
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.integrations.server import protocol as p
from prefixcache.integrations.server.admission import Ticket
from prefixcache.integrations.server.engine_calls import (
    check_engine_running,
    final_outputs,
    merged_snapshots,
    unless_disconnected,
)
from prefixcache.integrations.server.errors import ApiError
from prefixcache.integrations.server.sampling import (
    check_fits,
    encode_prompt,
    render_messages,
    sampling_params,
)
from prefixcache.integrations.server.state import ServerState, State, resolve_salt

router = APIRouter()
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # the OpenAI default for /v1/completions


def _prompt_list(prompt: str | list[str] | list[int] | list[list[int]]) -> list:
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    if not prompt:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    return list(prompt)


def _usage(outputs: Sequence[RequestOutput]) -> p.Usage:
    return p.make_usage(
        prompt_tokens=sum(o.num_prompt_tokens for o in outputs),
        completion_tokens=sum(len(c.token_ids) for o in outputs for c in o.outputs),
        cached_tokens=sum(o.num_cached_tokens for o in outputs),
    )


def _sse(payload: BaseModel | dict) -> str:
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


@dataclass
class _Prepared:
    """A request turned into engine inputs; holds its admission ticket."""

    state: ServerState
    prompts: list[list[int]]
    params: SamplingParams
    salt: str | None
    ticket: Ticket


def _prepare(state: ServerState, request: Request, body: p.SamplingFields,
             prompts: list[list[int]], max_tokens: int | None,
             default_max_tokens: int | None) -> _Prepared:
    state.check_model(body.model)
    salt = resolve_salt(request, body.cache_salt)
    params = sampling_params(state, body, [len(t) for t in prompts], max_tokens,
                             default_max_tokens)
    for token_ids in prompts:
        check_fits(state, token_ids, params, salt)
    check_engine_running(state)
    return _Prepared(state, prompts, params, salt, state.admission.admit())


def _stream(prepared: _Prepared, include_usage: bool,
            choice_chunk: Callable[[int, str, str | None, bool], BaseModel],
            usage_chunk: Callable[[p.Usage], BaseModel]) -> StreamingResponse:
    """SSE of text deltas per choice, an optional usage chunk, then ``data: [DONE]``.

    The client leaving closes this generator, which aborts the requests and frees their
    blocks; the admission ticket is released either way."""

    async def events() -> AsyncIterator[str]:
        sent: dict[int, int] = {}
        finished: dict[int, RequestOutput] = {}
        n = prepared.params.n
        try:
            async for prompt_index, output in merged_snapshots(
                prepared.state, prepared.prompts, prepared.params, prepared.salt
            ):
                for completion in output.outputs:
                    index = prompt_index * n + completion.index
                    first = index not in sent
                    delta = completion.text[sent.get(index, 0):]
                    sent[index] = len(completion.text)
                    if delta or first or completion.finish_reason:
                        yield _sse(choice_chunk(index, delta, completion.finish_reason, first))
                if output.finished:
                    finished[prompt_index] = output
            if include_usage:
                yield _sse(usage_chunk(_usage(list(finished.values()))))
        except ApiError as error:
            yield _sse(error.body())
        finally:
            prepared.ticket.release()
        yield "data: [DONE]\n\n"

    generator = events()
    weakref.finalize(generator, prepared.ticket.release)  # never started: still give it back
    return StreamingResponse(generator, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _whole(request: Request, prepared: _Prepared) -> list[RequestOutput]:
    try:
        return await unless_disconnected(
            request, final_outputs(prepared.state, prepared.prompts, prepared.params,
                                   prepared.salt)
        )
    finally:
        prepared.ticket.release()


@router.post("/v1/completions", response_model=None)
async def create_completion(
    body: p.CompletionRequest, request: Request, state: State
) -> p.CompletionResponse | StreamingResponse:
    prompts = [encode_prompt(state, prompt, "prompt") for prompt in _prompt_list(body.prompt)]
    prepared = _prepare(state, request, body, prompts, body.max_tokens,
                        COMPLETIONS_DEFAULT_MAX_TOKENS)
    response_id, model = p.new_id("cmpl"), state.model_name
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _stream(
            prepared, include_usage,
            lambda i, text, reason, _first: p.CompletionResponse(
                id=response_id, model=model,
                choices=[p.CompletionChoice(index=i, text=text, finish_reason=reason)]),
            lambda usage: p.CompletionResponse(id=response_id, model=model, choices=[],
                                               usage=usage),
        )
    outputs = await _whole(request, prepared)
    choices = [
        p.CompletionChoice(index=i * prepared.params.n + c.index, text=c.text,
                           finish_reason=c.finish_reason)
        for i, output in enumerate(outputs) for c in output.outputs
    ]
    return p.CompletionResponse(id=response_id, model=model, choices=choices,
                                usage=_usage(outputs))


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(
    body: p.ChatCompletionRequest, request: Request, state: State
) -> p.ChatCompletionResponse | StreamingResponse:
    state.check_model(body.model)
    prompt_text = render_messages(state, body.messages, body.tools)
    prompts = [encode_prompt(state, prompt_text, "messages")]
    max_tokens = body.max_completion_tokens if body.max_tokens is None else body.max_tokens
    prepared = _prepare(state, request, body, prompts, max_tokens, None)
    response_id, model = p.new_id("chatcmpl"), state.model_name
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _stream(
            prepared, include_usage,
            lambda i, text, reason, first: p.ChatCompletionChunk(
                id=response_id, model=model,
                choices=[p.ChatChunkChoice(
                    index=i, finish_reason=reason,
                    delta=p.ChatDelta(role="assistant" if first else None,
                                      content=text))]),
            lambda usage: p.ChatCompletionChunk(id=response_id, model=model, choices=[],
                                                usage=usage),
        )
    outputs = await _whole(request, prepared)
    choices = [
        p.ChatChoice(index=c.index, message=p.AssistantMessage(content=c.text),
                     finish_reason=c.finish_reason)
        for c in outputs[0].outputs
    ]
    return p.ChatCompletionResponse(id=response_id, model=model, choices=choices,
                                    usage=_usage(outputs))
