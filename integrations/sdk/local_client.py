"""``LocalClient``: the ``Client`` interface on an in-process ``LLM`` — no HTTP, no server.

Same methods, same results (``Completion``, ``Chunk``, cached tokens in ``usage``). Not
thread-safe: one caller at a time, as for ``LLM`` itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from prefixcache.engine.llm import LLM
from prefixcache.engine.outputs import RequestOutput
from prefixcache.engine.tool_calls import parser_for_template
from prefixcache.integrations.openai_structure import structure_of
from prefixcache.integrations.sdk.options import GenerationOptions
from prefixcache.integrations.sdk.results import Chunk, Completion, Usage
from prefixcache.integrations.sdk.wire import Messages
from prefixcache.integrations.server.tool_replies import (
    TOOL_CALLS_FINISH,
    ToolCallStream,
    reply_message,
)

COMPLETION_DEFAULT_MAX_TOKENS = 16


class LocalClient:
    """Drive ``llm`` through the SDK interface; ``model`` is only reported."""

    def __init__(self, llm: LLM, model: str | None = None) -> None:
        self.llm = llm
        self.model = model or llm.model_name
        self._ids = itertools.count()

    # ------------------------------------------------------------------ generation
    def complete(self, prompt: str | Sequence[int], **options: Any) -> Completion:
        opts = GenerationOptions(**options)
        return _completion(self.llm.generate(
            [self.llm.encode(prompt)], self._params(opts, prompt, COMPLETION_DEFAULT_MAX_TOKENS),
            salt=opts.salt)[0])

    def chat(self, messages: Messages, **options: Any) -> Completion:
        """A reply to ``messages``; with ``tools`` (and ``tool_choice`` not "none") its calls
        are parsed into ``tool_calls``, as the server does."""
        opts = GenerationOptions(**options)
        prompt = self.llm.render_chat(messages, opts.tools)
        output = self.llm.generate([prompt], self._params(opts, prompt, None),
                                   salt=opts.salt)[0]  # fmt: skip
        return _completion(output, self._tool_parser(opts))

    def stream(self, prompt: str | Sequence[int] | None = None, *,
               messages: Messages | None = None, **options: Any) -> Iterator[Chunk]:
        """Pieces of choice 0 after every engine step; closing early aborts the request."""
        opts = GenerationOptions(**options)
        parser = None
        if messages is not None:
            prompt, default = self.llm.render_chat(messages, opts.tools), None
            parser = self._tool_parser(opts)
        elif prompt is not None:
            default = COMPLETION_DEFAULT_MAX_TOKENS
        else:
            raise ValueError("give a prompt or messages")
        token_ids = self.llm.encode(prompt)
        params = self._params(opts, token_ids, default)
        calls = ToolCallStream(parser) if parser is not None else None
        self.llm.check_request(token_ids, params, opts.salt)
        request_id = f"local-{next(self._ids)}"
        engine = self.llm.engine
        engine.add_request(request_id, token_ids, params, opts.salt)
        sent, finished = 0, False
        try:
            while not finished:
                for output in engine.step():
                    if output.request_id != request_id:
                        continue
                    if output.error is not None:
                        finished = True
                        raise RuntimeError(f"the request could not complete: {output.error}")
                    text = output.text
                    finished = output.finished
                    if calls is not None:
                        yield from _call_chunks(calls, text[sent:], output, finished)
                    elif finished:
                        yield Chunk(text[sent:], output.finish_reason, _usage(output))
                    elif len(text) > sent:
                        yield Chunk(text[sent:])
                    sent = len(text)
        finally:
            if not finished:
                engine.abort(request_id)

    # ------------------------------------------------------------------ cache control
    def warm(self, prompt: str | Sequence[int] | None = None, *,
             messages: Messages | None = None, pin: bool = False,
             salt: str | None = None) -> int:
        return self.llm.warm(self._prefix(prompt, messages), salt=salt, pin=pin)

    def pin(self, prompt: str | Sequence[int] | None = None, *,
            messages: Messages | None = None, salt: str | None = None) -> int:
        return self.llm.cache.pin(self.llm.encode(self._prefix(prompt, messages)), salt)

    def unpin(self, prompt: str | Sequence[int] | None = None, *,
              messages: Messages | None = None, salt: str | None = None) -> None:
        self.llm.cache.unpin(self.llm.encode(self._prefix(prompt, messages)), salt)

    def lookup(self, prompt: str | Sequence[int] | None = None, *,
               messages: Messages | None = None, salt: str | None = None) -> int:
        token_ids = self.llm.encode(self._prefix(prompt, messages))
        return self.llm.cache.lookup(token_ids, salt, partial_block=True)

    def stats(self) -> dict[str, Any]:
        self.llm.cache.check_invariants()
        return self.llm.stats()

    def reset(self) -> int:
        return self.llm.cache.reset()

    def close(self) -> None:
        """Nothing to release (the caller owns ``llm``); present for interface parity."""

    # ------------------------------------------------------------------ internals
    def _prefix(self, prompt: str | Sequence[int] | None, messages: Messages | None
                ) -> str | Sequence[int]:
        if (prompt is None) == (messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self.llm.render_chat(messages) if messages is not None else prompt

    @property
    def parser(self) -> str:
        """The format this model writes tool calls in (what its chat template shows)."""
        template = self.llm.chat_template
        return parser_for_template(template.source if template else None)

    def _tool_parser(self, opts: GenerationOptions) -> str | None:
        return self.parser if opts.tools and opts.tool_choice != "none" else None

    def _params(self, opts: GenerationOptions, prompt: str | Sequence[int],
                default_max_tokens: int | None) -> Any:
        prompt_tokens = len(self.llm.encode(prompt))
        pool_tokens = self.llm.cache.num_blocks * self.llm.cache.block_size
        room = min(self.llm.max_model_len, pool_tokens) - prompt_tokens  # unset: what fits
        default = room if default_max_tokens is None else min(default_max_tokens, room)
        structured, _ = structure_of(
            structured_outputs=opts.structured_outputs, response_format=opts.response_format,
            tools=opts.tools, tool_choice=opts.tool_choice,
            parallel_tool_calls=opts.parallel_tool_calls is not False, parser=self.parser)
        return opts.sampling_params(max(default, 1), structured)


def _usage(output: RequestOutput) -> Usage:
    return Usage(prompt_tokens=output.num_prompt_tokens,
                 completion_tokens=sum(len(c.token_ids) for c in output.outputs),
                 cached_tokens=output.num_cached_tokens)


def _completion(output: RequestOutput, parser: str | None = None) -> Completion:
    """The SDK's result; with a tool-call ``parser`` each reply's calls are parsed out."""
    texts, reasons, calls = [], [], []
    for c in output.outputs:
        if parser is None:
            texts.append(c.text)
            reasons.append(c.finish_reason)
            continue
        message, reason = reply_message(c.text, parser, c.finish_reason)
        texts.append(message.content or "")
        reasons.append(reason)
        calls.append([call.model_dump() for call in message.tool_calls or []])
    return Completion(texts, reasons, _usage(output), calls if any(calls) else [])


def _call_chunks(calls: ToolCallStream, delta: str, output: RequestOutput,
                 finished: bool) -> Iterator[Chunk]:
    """The chunks of a step of a chat with tools: content and call deltas, then the finish
    ("tool_calls" when the reply ended on its own with calls) with the usage."""
    for piece in calls.feed(delta, finished):
        yield Chunk(piece.content or "", tool_calls=[d.model_dump(exclude_none=True)
                                                     for d in piece.tool_calls or []])
    if finished:
        reason = output.finish_reason
        if calls.made_calls and reason == "stop":
            reason = TOOL_CALLS_FINISH
        yield Chunk("", reason, _usage(output))
