"""Tool-call parsers on replies as models write them, malformed ones included: a reply that is
not a call in the parser's format stays text, never an error and never half a call."""

from __future__ import annotations

import json

import pytest

from prefixcache.engine.tool_calls import parse_tool_calls, parser_for_template
from prefixcache.engine.tool_prompt import tool_call_grammar, tool_functions

WEATHER = '{"city": "Paris", "days": 3}'


def calls(text: str, parser: str) -> list[tuple[str, dict]]:
    reply = parse_tool_calls(text, parser)
    assert all(call.id.startswith("call_") for call in reply.tool_calls)
    return [(call.name, json.loads(call.arguments)) for call in reply.tool_calls]


@pytest.mark.parametrize(("parser", "text", "expected", "content"), [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": ' + WEATHER + '}\n</tool_call>',
     [("get_weather", {"city": "Paris", "days": 3})], None),
    ("hermes", 'Let me check.\n<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
               '<tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}</tool_call>',
     [("a", {}), ("b", {"x": 1})], "Let me check."),
    # the second block was cut short (max_tokens): the whole first call is kept
    ("hermes", '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"na',
     [("a", {})], None),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": ' + WEATHER + "}",
     [("get_weather", {"city": "Paris", "days": 3})], None),
    ("llama3_json", '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"y": [1]}}',
     [("a", {}), ("b", {"y": [1]})], None),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + WEATHER + "}]",
     [("get_weather", {"city": "Paris", "days": 3})], None),
    ("mistral", 'Sure. [TOOL_CALLS] {"name": "a", "arguments": {"k": null}}',
     [("a", {"k": None})], "Sure."),
    ("pythonic", '[get_weather(city="Paris", days=3), ping()]',
     [("get_weather", {"city": "Paris", "days": 3}), ("ping", {})], None),
    ("pythonic", "<|python_start|>[f(x=[1, 2], y={'a': True})]<|python_end|>",
     [("f", {"x": [1, 2], "y": {"a": True}})], None),
])  # fmt: skip
def test_calls_are_parsed(parser: str, text: str, expected: list, content: str | None) -> None:
    assert calls(text, parser) == expected
    assert parse_tool_calls(text, parser).content == content


@pytest.mark.parametrize(("parser", "text"), [
    ("hermes", "It is sunny in Paris."),
    ("hermes", "<tool_call>{not json}</tool_call>"),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),  # no name
    ("hermes", '<tool_call>{"name": "a", "arguments": [1]}</tool_call>'),  # not an object
    ("hermes", '<tool_call>{"name": "a", "arguments": {}}'),  # never closed
    ("llama3_json", '{"name": "a", "parameters": {}} and then some words'),
    ("llama3_json", '{"answer": 42}'),  # JSON, but not a call
    ("mistral", "[TOOL_CALLS][{broken"),
    ("pythonic", "[get_weather(city=paris_variable)]"),  # not a literal
    ("pythonic", "[1, 2, 3]"),
    ("pythonic", '[f("positional")]'),
    ("pythonic", "[__import__('os').system('ls')]"),
])  # fmt: skip
def test_a_reply_that_is_not_a_call_stays_text(parser: str, text: str) -> None:
    reply = parse_tool_calls(text, parser)
    assert reply.tool_calls == () and reply.content == text


def test_the_parser_follows_the_template() -> None:
    assert parser_for_template("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert parser_for_template("{% if message.role == 'ipython' %}") == "llama3_json"
    assert parser_for_template("<|python_start|>") == "pythonic"
    assert parser_for_template("<tool_call>") == parser_for_template(None) == "hermes"


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_tool_grammars_and_their_errors() -> None:
    for parser in ("hermes", "llama3_json", "mistral"):
        grammar = tool_call_grammar(TOOLS, parser, parallel=False)
        assert "get_weather" in grammar and '"additionalProperties": false' in grammar
    with pytest.raises(ValueError, match="not among the tools"):
        tool_call_grammar(TOOLS, "hermes", only="send_email")
    with pytest.raises(ValueError, match="pythonic"):
        tool_call_grammar(TOOLS, "pythonic")
    with pytest.raises(ValueError, match=r"tools\[0\]"):
        tool_functions([{"type": "function", "function": {"description": "no name"}}])


def test_a_repeated_call_is_dropped() -> None:
    block = '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>'
    other = '<tool_call>{"name": "a", "arguments": {"x": 2}}</tool_call>'
    assert calls("\n".join([block, block, other, block]), "hermes") == [("a", {"x": 1}),
                                                                        ("a", {"x": 2})]
