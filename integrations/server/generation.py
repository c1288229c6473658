"""What both generation routes share: a request turned into engine inputs (``prepare``), its
outputs whole (``whole``) or streamed as SSE (``stream``), and usage."""

from __future__ import annotations

import json
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from prefixcache.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.structured_output import StructuredOutput
from prefixcache.integrations.server import protocol as p
from prefixcache.integrations.server.admission import Ticket
from prefixcache.integrations.server.cache_control import PinRequest, apply_pins, created_tokens
from prefixcache.integrations.server.engine_calls import (
    check_engine_running,
    final_outputs,
    merged_snapshots,
    unless_disconnected,
)
from prefixcache.integrations.server.errors import ApiError
from prefixcache.integrations.server.sampling import check_fits, sampling_params
from prefixcache.integrations.server.state import ServerState, resolve_salt


def usage_of(outputs: Sequence[RequestOutput], pins: Sequence[PinRequest] = ()) -> p.Usage:
    cached = sum(o.num_cached_tokens for o in outputs)
    return p.make_usage(
        prompt_tokens=sum(o.num_prompt_tokens for o in outputs),
        completion_tokens=sum(len(c.token_ids) for o in outputs for c in o.outputs),
        cached_tokens=cached, created_tokens=created_tokens(pins, cached),
    )


def sse(payload: BaseModel | dict) -> str:
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


@dataclass
class Prepared:
    """A request turned into engine inputs; holds its admission ticket."""

    state: ServerState
    prompts: list[list[int]]
    params: SamplingParams
    salt: str | None
    ticket: Ticket
    pins: list[PinRequest] = field(default_factory=list)  # made once the request has run


def prepare(state: ServerState, request: Request, body: p.SamplingFields,
            prompts: list[list[int]], max_tokens: int | None,
            default_max_tokens: int | None, max_tokens_param: str = "max_tokens",
            structured: StructuredOutput | None = None,
            logprobs: int | None = None, salt: str | None = None) -> Prepared:  # fmt: skip
    """Checked params for ``prompts`` (``structured``: what the output must match;
    ``logprobs``: top tokens to report, None for none) and an admission ticket. ``salt``:
    the request's, resolved already (else resolved here)."""
    state.check_model(body.model)
    salt = salt if salt is not None else resolve_salt(request, body.cache_salt)
    params = sampling_params(state, body, [len(t) for t in prompts], max_tokens,
                             default_max_tokens, max_tokens_param, structured, logprobs)
    for token_ids in prompts:
        check_fits(state, token_ids, params, salt, max_tokens_param)
    check_engine_running(state)
    return Prepared(state, prompts, params, salt, state.admission.admit())


class ChoiceStep(NamedTuple):
    """What a snapshot of a choice adds: text, the finish reason once it finished, whether
    it is the choice's first, and the log probabilities of its new tokens (if asked for)."""

    delta: str
    finish_reason: str | None
    first: bool
    logprobs: list[TokenLogprob]


class ChoiceProgress:
    """What a stream has sent of each choice: its text and tokens so far, whether it ended."""

    def __init__(self) -> None:
        self._sent: dict[int, int] = {}  # choice index -> characters of its text sent
        self._tokens: dict[int, int] = {}  # choice index -> log probabilities sent
        self._done: set[int] = set()  # choices whose finish chunk went out

    def step(self, index: int, completion: CompletionOutput) -> ChoiceStep | None:
        """What to send for this snapshot of choice ``index``, or None: nothing new, or the
        choice already finished (a finished choice's snapshot is repeated while others run;
        its finish chunk goes out once)."""
        if index in self._done:
            return None
        first = index not in self._sent
        delta = completion.text[self._sent.get(index, 0):]
        self._sent[index] = len(completion.text)
        entries = completion.logprobs or []
        new = entries[self._tokens.get(index, 0):]
        self._tokens[index] = len(entries)
        if completion.finish_reason:
            self._done.add(index)
        if delta or first or completion.finish_reason or new:
            return ChoiceStep(delta, completion.finish_reason, first, list(new))
        return None


ChoiceChunks = Callable[[int, ChoiceStep], list[BaseModel]]


def stream(prepared: Prepared, include_usage: bool, choice_chunks: ChoiceChunks,
           usage_chunk: Callable[[p.Usage], BaseModel]) -> StreamingResponse:
    """SSE of the chunks ``choice_chunks`` makes of each choice's steps, an optional usage
    chunk, then ``data: [DONE]``.

    Each choice gets a first chunk, chunks for its deltas, and exactly one chunk carrying its
    ``finish_reason`` (its last), however long the other choices go on. The client leaving
    closes this generator, which aborts the requests and frees their blocks; the admission
    ticket is released either way."""

    async def events() -> AsyncIterator[str]:
        progress = ChoiceProgress()
        finished: dict[int, RequestOutput] = {}
        n = prepared.params.n
        try:
            async for prompt_index, output in merged_snapshots(
                prepared.state, prepared.prompts, prepared.params, prepared.salt
            ):
                for completion in output.outputs:
                    index = prompt_index * n + completion.index
                    step = progress.step(index, completion)
                    if step is not None:
                        for chunk in choice_chunks(index, step):
                            yield sse(chunk)
                if output.finished:
                    finished[prompt_index] = output
            await apply_pins(prepared.state, prepared.salt, prepared.pins)
            if include_usage:
                yield sse(usage_chunk(usage_of(list(finished.values()), prepared.pins)))
        except ApiError as error:
            yield sse(error.body())
        finally:
            prepared.ticket.release()
        yield "data: [DONE]\n\n"

    generator = events()
    weakref.finalize(generator, prepared.ticket.release)  # never started: still give it back
    return StreamingResponse(generator, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def whole(request: Request, prepared: Prepared) -> list[RequestOutput]:
    try:
        outputs = await unless_disconnected(
            request, final_outputs(prepared.state, prepared.prompts, prepared.params,
                                   prepared.salt)
        )
    finally:
        prepared.ticket.release()
    await apply_pins(prepared.state, prepared.salt, prepared.pins)
    return outputs
