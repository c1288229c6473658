"""Tool calls in a model's reply: the formats model families write them in, each parsed into
OpenAI's ``tool_calls`` (vLLM's parser names).

* ``hermes`` (Hermes, Qwen 2/2.5/3, and this project's fallback template):
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call, text
  before the first block is the reply's content.
* ``llama3_json`` (Llama 3.1/3.2 JSON tool use): the reply is ``<|python_tag|>`` or nothing,
  then one or more ``{"name": ..., "parameters": {...}}`` objects separated by ``;``.
* ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name": ..., "arguments": {...}}``.
* ``pythonic`` (Llama 3.2/4 pythonic, ToolACE): a Python list of calls with keyword arguments,
  ``[get_weather(city="Paris", days=3), ...]``, literal values only.

A reply that does not parse as calls in its format — a broken JSON object, an unknown shape —
stays text: a malformed call is never an error and never half a call. A call that repeats an
earlier call of the same reply exactly (name and arguments) is dropped: that is a small model
looping (SmolLM2-135M, forced to call, made the same call two or three times), not a second
request. Pure Python.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral", "pythonic")


@dataclass(frozen=True)
class ToolCall:
    """One call: ``arguments`` is the JSON text of an object, as OpenAI sends it."""

    name: str
    arguments: str
    id: str = ""

    def with_id(self) -> ToolCall:
        return self if self.id else ToolCall(self.name, self.arguments, new_call_id())


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into its text (None when the reply is only calls) and its calls."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str, parser: str) -> ParsedReply:
    """``text`` split by ``parser`` (one of ``TOOL_CALL_PARSERS``) into content and calls,
    each call with a new id; no calls, and ``text`` as the content, when it does not parse."""
    found = PARSERS[parser](text)
    if found is None or not found.tool_calls:
        return ParsedReply(text)
    unique = list(dict.fromkeys(found.tool_calls))  # calls have no id yet: equal = repeated
    return ParsedReply(found.content, tuple(call.with_id() for call in unique))


def _call_of(obj: Any, arguments_key: str = "arguments") -> ToolCall | None:
    """A call from ``{"name": str, <arguments_key>: object}`` (arguments may also be given as
    the JSON text of an object); None for any other shape."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _hermes(text: str) -> ParsedReply | None:
    """Closed blocks are calls (a last block left open, as when the reply ran out of tokens,
    is dropped); any block that is not a call makes the whole reply text."""
    start = text.find("<tool_call>")
    if start < 0:
        return None
    calls = []
    for block in _HERMES_BLOCK.findall(text[start:]):
        try:
            call = _call_of(json.loads(block))
        except ValueError:
            return None
        if call is None:
            return None
        calls.append(call)
    content = text[:start].strip()
    return ParsedReply(content or None, tuple(calls))


def _llama3_json(text: str) -> ParsedReply | None:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return None
    decoder = json.JSONDecoder()
    calls, at = [], 0
    while True:
        try:
            obj, at = decoder.raw_decode(body, at)
        except ValueError:
            return None
        call = _call_of(obj, "parameters")
        if call is None:
            return None
        calls.append(call)
        rest = body[at:].lstrip()
        if not rest:
            return ParsedReply(None, tuple(calls))
        if not rest.startswith(";"):
            return None
        at = len(body) - len(rest[1:].lstrip())


def _mistral(text: str) -> ParsedReply | None:
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return None
    try:
        listed = json.loads(text[start + len("[TOOL_CALLS]") :])
    except ValueError:
        return None
    listed = listed if isinstance(listed, list) else [listed]
    calls = [_call_of(item) for item in listed]
    if not calls or any(call is None for call in calls):
        return None
    content = text[:start].strip()
    return ParsedReply(content or None, tuple(c for c in calls if c is not None))


def _pythonic(text: str) -> ParsedReply | None:
    body = text.strip().removeprefix("<|python_start|>").removesuffix("<|python_end|>").strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        try:
            arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords
                         if kw.arg is not None}  # fmt: skip
        except ValueError:
            return None
        if len(arguments) != len(node.keywords):
            return None
        calls.append(ToolCall(node.func.id, json.dumps(arguments, ensure_ascii=False)))
    return ParsedReply(None, tuple(calls))


PARSERS: dict[str, Callable[[str], ParsedReply | None]] = {
    "hermes": _hermes, "llama3_json": _llama3_json, "mistral": _mistral, "pythonic": _pythonic,
}  # fmt: skip

# what a reply in each format starts with once it is a call (streaming holds such text back)
CALL_MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": ("<tool_call>",), "llama3_json": ("<|python_tag|>", "{"),
    "mistral": ("[TOOL_CALLS]",), "pythonic": ("[", "<|python_start|>"),
}  # fmt: skip


def parser_for_template(template_source: str | None) -> str:
    """The parser whose format a chat template writes calls in ("hermes" when it shows none:
    the fallback template asks for that one)."""
    source = template_source or ""
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|python_tag|>" in source or "ipython" in source:
        return "llama3_json"
    if "<|python_start|>" in source:
        return "pythonic"
    return "hermes"
