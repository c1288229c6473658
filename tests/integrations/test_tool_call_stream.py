"""Streamed tool calls: however a reply is cut into deltas, the content sent adds up to the
text before the calls, each call goes out once (its name, then its arguments), a repeat is
dropped, and held text that turns out not to be a call goes out as content."""

from __future__ import annotations

import json

import pytest

from prefixcache.integrations.server.tool_replies import ToolCallStream

HERMES = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
          '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
          '</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"q": "rain"}}\n</tool_call>')


def play(parser: str, text: str, size: int) -> tuple[str, list[tuple[str, dict]]]:
    """Feed ``text`` in ``size``-character deltas; (content sent, calls sent)."""
    stream = ToolCallStream(parser)
    content, calls, names = "", [], {}
    pieces = [text[i : i + size] for i in range(0, len(text), size)] or [""]
    for index, piece in enumerate(pieces):
        for delta in stream.feed(piece, index == len(pieces) - 1):
            content += delta.content or ""
            for call in delta.tool_calls or []:
                if call.function.name is not None:
                    names[call.index] = [call.function.name, ""]
                else:
                    names[call.index][1] += call.function.arguments
    calls = [(name, json.loads(arguments)) for name, arguments in names.values()]
    assert stream.made_calls == bool(calls)
    return content, calls


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_hermes_calls_stream_once_each_whatever_the_deltas(size: int) -> None:
    content, calls = play("hermes", HERMES, size)
    assert content == "Checking.\n"
    assert calls == [("get_weather", {"city": "Oslo"}), ("search", {"q": "rain"})]


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_text_that_is_not_a_call_goes_out_as_content(size: int) -> None:
    for parser, text in [("hermes", "no <tool_ call here, just text"),
                         ("hermes", "<tool_call>{broken json</tool_call>"),
                         ("llama3_json", '{"answer": 42}'),
                         ("pythonic", "[1, 2, 3]")]:  # fmt: skip
        content, calls = play(parser, text, size)
        assert (content, calls) == (text, [])


def test_whole_reply_formats_are_parsed_at_the_end() -> None:
    assert play("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"a": 1}}', 4) == \
        ("", [("f", {"a": 1})])  # fmt: skip
    assert play("pythonic", '[f(a=1), g(b="x")]', 2) == ("", [("f", {"a": 1}),
                                                             ("g", {"b": "x"})])
    assert play("mistral", 'Sure [TOOL_CALLS][{"name": "f", "arguments": {}}]', 3) == \
        ("Sure ", [("f", {})])  # fmt: skip
