"""``/v1/completions`` and ``/v1/chat/completions``: streamed (SSE) or whole responses."""

from __future__ import annotations

import json
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from prefixcache.engine.outputs import CompletionOutput, RequestOutput
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.structured_output import StructuredOutput
from prefixcache.engine.tool_prompt import tool_functions
from prefixcache.integrations.server import protocol as p
from prefixcache.integrations.server.admission import Ticket
from prefixcache.integrations.server.engine_calls import (
    check_engine_running,
    final_outputs,
    merged_snapshots,
    unless_disconnected,
)
from prefixcache.integrations.server.errors import ApiError, bad_request, error_responses
from prefixcache.integrations.server.openapi_contract import sse_events
from prefixcache.integrations.server.prompt_encoding import (
    encode_prompt,
    encode_prompts,
    render_messages,
)
from prefixcache.integrations.server.sampling import check_fits, sampling_params
from prefixcache.integrations.server.state import ServerState, State, resolve_salt
from prefixcache.integrations.server.structured_request import requested_structure
from prefixcache.integrations.server.tool_replies import (
    TOOL_CALLS_FINISH,
    ToolCallStream,
    reply_message,
)
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
             default_max_tokens: int | None, max_tokens_param: str = "max_tokens",
             structured: StructuredOutput | None = None) -> _Prepared:
    state.check_model(body.model)
    salt = resolve_salt(request, body.cache_salt)
    params = sampling_params(state, body, [len(t) for t in prompts], max_tokens,
                             default_max_tokens, max_tokens_param, structured)
    for token_ids in prompts:
        check_fits(state, token_ids, params, salt, max_tokens_param)
    check_engine_running(state)
    return _Prepared(state, prompts, params, salt, state.admission.admit())


class _ChoiceProgress:
    """What a stream has sent of each choice: its text so far, and whether it has finished."""

    def __init__(self) -> None:
        self._sent: dict[int, int] = {}  # choice index -> characters of its text sent
        self._done: set[int] = set()  # choices whose finish chunk went out

    def next_chunk(self, index: int, completion: CompletionOutput
                   ) -> tuple[str, str | None, bool] | None:
        """``(delta, finish_reason, first)`` to send for this snapshot of choice ``index``, or
        None: nothing new, or the choice already finished (a finished choice's snapshot is
        repeated while others run; its finish chunk goes out once)."""
        if index in self._done:
            return None
        first = index not in self._sent
        delta = completion.text[self._sent.get(index, 0):]
        self._sent[index] = len(completion.text)
        if completion.finish_reason:
            self._done.add(index)
        if delta or first or completion.finish_reason:
            return delta, completion.finish_reason, first
        return None


def _stream(prepared: _Prepared, include_usage: bool,
            choice_chunks: Callable[[int, str, str | None, bool], list[BaseModel]],
            usage_chunk: Callable[[p.Usage], BaseModel]) -> StreamingResponse:
    """SSE of the chunks ``choice_chunks`` makes of each choice's text deltas, an optional
    usage chunk, then ``data: [DONE]``.

    Each choice gets a first chunk, chunks for its deltas, and exactly one chunk carrying its
    ``finish_reason`` (its last), however long the other choices go on. The client leaving
    closes this generator, which aborts the requests and frees their blocks; the admission
    ticket is released either way."""

    async def events() -> AsyncIterator[str]:
        progress = _ChoiceProgress()
        finished: dict[int, RequestOutput] = {}
        n = prepared.params.n
        try:
            async for prompt_index, output in merged_snapshots(
                prepared.state, prepared.prompts, prepared.params, prepared.salt
            ):
                for completion in output.outputs:
                    index = prompt_index * n + completion.index
                    step = progress.next_chunk(index, completion)
                    if step is not None:
                        for chunk in choice_chunks(index, *step):
                            yield _sse(chunk)
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


@router.post("/v1/completions", response_model=None,
             responses=_json_or_stream(p.CompletionResponse, p.CompletionResponse))
async def create_completion(
    body: p.CompletionRequest, request: Request, state: State
) -> p.CompletionResponse | StreamingResponse:
    state.check_model(body.model)
    refuse_unsupported("completions", body.model_extra)
    structured, _ = requested_structure(state, body)
    prompts = await encode_prompts(state, _prompt_list(body.prompt), "prompt")
    prepared = _prepare(state, request, body, prompts, body.max_tokens,
                        COMPLETIONS_DEFAULT_MAX_TOKENS, structured=structured)
    response_id, model = p.new_id("cmpl"), state.model_name
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _stream(
            prepared, include_usage,
            lambda i, text, reason, _first: [p.CompletionResponse(
                id=response_id, model=model,
                choices=[p.CompletionChoice(index=i, text=text, finish_reason=reason)])],
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


@router.post("/v1/chat/completions", response_model=None,
             responses=_json_or_stream(p.ChatCompletionResponse, p.ChatCompletionChunk))
async def create_chat_completion(
    body: p.ChatCompletionRequest, request: Request, state: State
) -> p.ChatCompletionResponse | StreamingResponse:
    state.check_model(body.model)
    refuse_unsupported("chat", body.model_extra)
    parser = _tool_parser(state, body)
    structured, _ = requested_structure(state, body, state.tool_call_parser)
    prompt_text = await render_messages(state, body.messages, body.tools)
    prompts = [await encode_prompt(state, prompt_text, "messages")]
    max_tokens, max_tokens_param = _chat_max_tokens(body)
    prepared = _prepare(state, request, body, prompts, max_tokens, None, max_tokens_param,
                        structured)  # fmt: skip
    response_id, model = p.new_id("chatcmpl"), state.model_name
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _stream(
            prepared, include_usage, _chat_chunks(response_id, model, parser),
            lambda usage: p.ChatCompletionChunk(id=response_id, model=model, choices=[],
                                                usage=usage),
        )
    outputs = await _whole(request, prepared)
    choices = []
    for c in outputs[0].outputs:
        message, finish_reason = reply_message(c.text, parser, c.finish_reason)
        choices.append(p.ChatChoice(index=c.index, message=message, finish_reason=finish_reason))
    return p.ChatCompletionResponse(id=response_id, model=model, choices=choices,
                                    usage=_usage(outputs))


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


def _chat_chunks(response_id: str, model: str, parser: str | None
                 ) -> Callable[[int, str, str | None, bool], list[BaseModel]]:
    """A streamed chat's chunks for a step of choice ``i``: its text delta (a first chunk
    also names the role), or with a tool-call ``parser`` the content and call deltas of a
    ``ToolCallStream``, then the finish ("tool_calls" when the reply made calls)."""
    streams: dict[int, ToolCallStream] = {}

    def chunk(i: int, delta: p.ChatDelta, reason: str | None) -> p.ChatCompletionChunk:
        return p.ChatCompletionChunk(id=response_id, model=model, choices=[
            p.ChatChunkChoice(index=i, delta=delta, finish_reason=reason)])

    def chunks(i: int, text: str, reason: str | None, first: bool) -> list[BaseModel]:
        role = "assistant" if first else None
        if parser is None:
            return [chunk(i, p.ChatDelta(role=role, content=text), reason)]
        stream = streams.setdefault(i, ToolCallStream(parser))
        out: list[BaseModel] = [chunk(i, p.ChatDelta(role=role, content=""), None)] if first \
            else []  # fmt: skip
        for delta in stream.feed(text, reason is not None):
            out.append(chunk(i, p.ChatDelta(content=delta.content, tool_calls=delta.tool_calls),
                             None))  # fmt: skip
        if reason is not None:
            made_calls = stream.made_calls and reason == "stop"
            out.append(chunk(i, p.ChatDelta(), TOOL_CALLS_FINISH if made_calls else reason))
        return out

    return chunks
