"""A chat reply's tool calls, whole or streamed, in OpenAI's shapes.

Whole: the reply's text is parsed once (``parse_tool_calls``) into the message's ``content``
and ``tool_calls``; ``finish_reason`` becomes "tool_calls" when there are calls.

Streamed (``ToolCallStream``, one per choice): text is sent as content deltas until it may be
the start of a call in the parser's format; from there on it is held. A Hermes block is sent as
a call as soon as it closes (its id, type and name in one delta, its arguments in the next);
the other formats are parsed when the choice finishes. Held text that turns out not to be a
call is sent as content, so a streamed reply always adds up to the whole reply.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixcache.engine.tool_calls import CALL_MARKERS, ParsedReply, ToolCall, parse_tool_calls
from prefixcache.integrations.server import protocol as p

TOOL_CALLS_FINISH = "tool_calls"


def reply_message(text: str, parser: str | None, finish_reason: str | None
                  ) -> tuple[p.AssistantMessage, str | None]:
    """The assistant message of ``text`` and the finish reason to report (``parser`` None:
    tools are off for this request, the text is the content): "tool_calls" for a reply that
    ended on its own with calls; one cut short ("length") keeps its reason and its whole calls.
    """
    if parser is None:
        return p.AssistantMessage(content=text), finish_reason
    parsed = parse_tool_calls(text, parser)
    if not parsed.tool_calls:
        return p.AssistantMessage(content=text), finish_reason
    calls = [_wire_call(call) for call in parsed.tool_calls]
    reason = TOOL_CALLS_FINISH if finish_reason == "stop" else finish_reason
    return p.AssistantMessage(content=parsed.content, tool_calls=calls), reason


def _wire_call(call: ToolCall) -> p.ToolCall:
    return p.ToolCall(id=call.id, function=p.FunctionCall(name=call.name,
                                                          arguments=call.arguments))


@dataclass
class StreamDelta:
    """What to send for one step of a choice: content text and / or call deltas."""

    content: str | None = None
    tool_calls: list[p.ToolCallDelta] | None = None


class ToolCallStream:
    """One streamed choice of a request with tools (``parser``: the calls' format)."""

    def __init__(self, parser: str) -> None:
        self.parser = parser
        self.markers = CALL_MARKERS[parser]
        self.text = ""  # the reply so far
        self.sent = 0  # characters of it sent as content
        self.held_from: int | None = None  # where a possible call starts
        self.calls = 0  # calls sent
        self.sent_calls: set[tuple[str, str]] = set()  # (name, arguments): repeats are dropped
        self.parsed_to = 0  # characters parsed into calls (Hermes blocks)

    @property
    def made_calls(self) -> bool:
        return self.calls > 0

    def feed(self, delta: str, finished: bool) -> list[StreamDelta]:
        """The deltas to send after the reply grew by ``delta`` (``finished``: it is whole)."""
        self.text += delta
        out: list[StreamDelta] = []
        if self.held_from is None:
            start = self._call_start()
            end = start if start is not None else self._safe_end(finished)
            if end > self.sent:
                out.append(StreamDelta(content=self.text[self.sent:end]))
                self.sent = end
            self.held_from = start
        if self.held_from is not None:
            out += self._calls(finished)
        return out

    def _call_start(self) -> int | None:
        """Where a call starts in the text, if it has begun one."""
        if self.parser == "hermes" or self.parser == "mistral":
            found = self.text.find(self.markers[0])
            return None if found < 0 else found
        stripped = self.text.lstrip()
        if any(stripped.startswith(m) for m in self.markers):
            return len(self.text) - len(stripped)
        return None

    def _safe_end(self, finished: bool) -> int:
        """How much of the text can go out as content: all of it unless its tail may still
        grow into a call marker."""
        if finished:
            return len(self.text)
        if self.parser in ("llama3_json", "pythonic") and not self.text.strip():
            return self.sent  # whitespace before what may be a call: wait
        for marker in self.markers:
            for size in range(min(len(marker) - 1, len(self.text)), 0, -1):
                if marker.startswith(self.text[-size:]):
                    return len(self.text) - size
        return len(self.text)

    def _calls(self, finished: bool) -> list[StreamDelta]:
        assert self.held_from is not None
        out: list[StreamDelta] = []
        if self.parser == "hermes":
            while True:  # every block closed since the last look
                close = self.text.find("</tool_call>", max(self.parsed_to, self.held_from))
                if close < 0:
                    break
                end = close + len("</tool_call>")
                parsed = parse_tool_calls(self.text[self.parsed_to or self.held_from : end],
                                          "hermes")  # fmt: skip
                if not parsed.tool_calls:
                    break  # a malformed block: what is held goes out as text at the end
                out += [d for call in parsed.tool_calls for d in self._call_deltas(call)]
                self.parsed_to = end
        if not finished:
            return out
        rest = self.text[self.parsed_to or self.held_from :]
        parsed: ParsedReply = parse_tool_calls(rest, self.parser) if rest.strip() else \
            ParsedReply(None)  # fmt: skip
        if parsed.tool_calls:
            out += [d for call in parsed.tool_calls for d in self._call_deltas(call)]
        elif rest.strip() or not self.calls:
            out.append(StreamDelta(content=rest))  # not a call after all: text
        return out

    def _call_deltas(self, call: ToolCall) -> list[StreamDelta]:
        """A call as OpenAI streams one: its id, type and name, then its arguments (nothing
        for a repeat of a call already sent, as ``parse_tool_calls`` drops it)."""
        if (call.name, call.arguments) in self.sent_calls:
            return []
        self.sent_calls.add((call.name, call.arguments))
        index = self.calls
        self.calls += 1
        head = p.ToolCallDelta(index=index, id=call.id, type="function",
                               function=p.FunctionCallDelta(name=call.name, arguments=""))
        body = p.ToolCallDelta(index=index, function=p.FunctionCallDelta(arguments=call.arguments))
        return [StreamDelta(tool_calls=[head]), StreamDelta(tool_calls=[body])]
