"""The chunks of a streamed chat completion, per choice step: the role first, then content
deltas (or, with tools, the content and call deltas of a ``ToolCallStream``), each step's log
probabilities on its first chunk, and the finish last ("tool_calls" when the reply ended on its
own with calls)."""

from __future__ import annotations

from pydantic import BaseModel

from prefixcache.engine.tokenizer import Tokenizer
from prefixcache.integrations.server import protocol as p
from prefixcache.integrations.server.generation import ChoiceChunks, ChoiceStep
from prefixcache.integrations.server.logprobs_wire import chat_logprobs
from prefixcache.integrations.server.tool_replies import TOOL_CALLS_FINISH, ToolCallStream


def chat_chunks(response_id: str, model: str, parser: str | None,
                tokenizer: Tokenizer) -> ChoiceChunks:  # fmt: skip
    """``parser``: the tool-call format, None when the request has no tools on."""
    streams: dict[int, ToolCallStream] = {}

    def chunk(i: int, delta: p.ChatDelta, reason: str | None = None) -> p.ChatCompletionChunk:
        return p.ChatCompletionChunk(id=response_id, model=model, choices=[
            p.ChatChunkChoice(index=i, delta=delta, finish_reason=reason)])

    def chunks(i: int, step: ChoiceStep) -> list[BaseModel]:
        role = "assistant" if step.first else None
        if parser is None:
            out = [chunk(i, p.ChatDelta(role=role, content=step.delta), step.finish_reason)]
        else:
            stream = streams.setdefault(i, ToolCallStream(parser))
            out = [chunk(i, p.ChatDelta(role=role, content=""))] if step.first else []
            for delta in stream.feed(step.delta, step.finish_reason is not None):
                out.append(chunk(i, p.ChatDelta(content=delta.content,
                                                tool_calls=delta.tool_calls)))  # fmt: skip
            if step.finish_reason is not None:
                made_calls = stream.made_calls and step.finish_reason == "stop"
                out.append(chunk(i, p.ChatDelta(),
                                 TOOL_CALLS_FINISH if made_calls else step.finish_reason))
        if step.logprobs:
            if not out:
                out.append(chunk(i, p.ChatDelta()))
            out[0].choices[0].logprobs = chat_logprobs(tokenizer, step.logprobs)
        return out

    return chunks
