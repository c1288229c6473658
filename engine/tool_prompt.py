"""Tools in the prompt, and the grammar that makes a reply a call.

A chat template that takes the ``tools`` variable renders tools, assistant ``tool_calls`` and
``tool`` messages itself. For one that does not (SmolLM2-135M's, for one), ``with_tool_turns``
rewrites the conversation in the Hermes format the ``hermes`` parser reads, as Qwen 2.5's
template writes it: the tools' JSON signatures and the call instructions join the system
message, an assistant's calls become ``<tool_call>`` blocks of its content, and tool results
become a user turn of ``<tool_response>`` blocks.

``tool_call_grammar`` is the Lark grammar (llguidance's dialect, schemas embedded as
``%json``) of a reply that is exactly one call, or one or more calls, in a parser's format,
each call's arguments constrained by its function's JSON Schema: what ``tool_choice``
"required" or a named function asks for.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from prefixcache.engine.grammar_defaults import JSON_OPTIONS

HERMES_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{signatures}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def tool_functions(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``function`` objects of OpenAI ``tools`` entries (``{"type": "function",
    "function": {"name", "description", "parameters"}}``); ValueError for another shape."""
    functions = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
            raise ValueError(f"tools[{index}] must be {{'type': 'function', 'function': {{...}}}}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise ValueError(f"tools[{index}].function needs a non-empty 'name'")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, Mapping):
            raise ValueError(f"tools[{index}].function.parameters must be a JSON Schema object")
        functions.append({**function, "parameters": dict(parameters)})
    return functions


def with_tool_turns(messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """``messages`` for a template without tool support: the tools' instructions in the
    system message (``tools`` given), calls as ``<tool_call>`` blocks, tool results as user
    turns of ``<tool_response>`` blocks (consecutive results share one turn)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            blocks = [_call_block(call) for call in message["tool_calls"]]
            text = _text(message.get("content"))
            out.append({"role": "assistant", "content": "\n".join([text, *blocks] if text
                                                                   else blocks)})  # fmt: skip
        elif role == "tool":
            block = f"<tool_response>\n{_text(message.get('content'))}\n</tool_response>"
            if out and out[-1].get("role") == "user" and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append({key: value for key, value in message.items() if key != "tool_calls"})
    for message in out:
        message.pop("_tool_results", None)
    if tools:
        signatures = "\n".join(json.dumps({"type": "function", "function": f}, ensure_ascii=False)
                               for f in tool_functions(tools))  # fmt: skip
        instructions = HERMES_INSTRUCTIONS.format(signatures=signatures)
        if out and out[0].get("role") in ("system", "developer"):
            first = _text(out[0].get("content"))
            out[0] = {**out[0], "role": "system",
                      "content": f"{first}\n\n{instructions}" if first else instructions}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return content or ""


def _call_block(call: Mapping[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # else shown as the client sent it
            arguments = json.loads(arguments)
    body = json.dumps({"name": function.get("name"), "arguments": arguments},
                      ensure_ascii=False)  # fmt: skip
    return f"<tool_call>\n{body}\n</tool_call>"


def _closed(parameters: dict[str, Any]) -> dict[str, Any]:
    """An object schema that does not say otherwise takes no properties beyond its own (as
    OpenAI's strict function calling requires): a constrained small model otherwise fills the
    arguments with keys copied from the schema's own text."""
    if parameters.get("type") == "object" and "additionalProperties" not in parameters:
        return {**parameters, "additionalProperties": False}
    return parameters


def tool_call_grammar(tools: Sequence[Mapping[str, Any]], parser: str, *,
                      only: str | None = None, parallel: bool = True) -> str:
    """A Lark grammar of a reply that is one call (``parallel`` False) or one or more calls in
    ``parser``'s format, to ``only`` the function named so, or to any of ``tools``; each
    call's arguments follow its function's parameter schema. ValueError for an unknown
    function name or a parser without a grammar."""
    functions = tool_functions(tools)
    if only is not None:
        functions = [f for f in functions if f["name"] == only]
        if not functions:
            raise ValueError(f"tool_choice names {only!r}, which is not among the tools")
    if not functions:
        raise ValueError("tool_choice needs at least one tool")
    key = "parameters" if parser == "llama3_json" else "arguments"
    call_schema = {"anyOf": [{
        "type": "object",
        "properties": {"name": {"const": f["name"]}, key: _closed(f["parameters"])},
        "required": ["name", key], "additionalProperties": False,
    } for f in functions], "x-guidance": JSON_OPTIONS}  # fmt: skip
    call = f"%json {json.dumps(call_schema)}"
    if parser == "hermes":
        more = ' ("\\n" block)*' if parallel else ""
        return (f"start: block{more}\n"
                f'block: "<tool_call>\\n" call "\\n</tool_call>"\ncall: {call}\n')
    if parser == "llama3_json":
        more = ' ("; " call)*' if parallel else ""
        return f"start: call{more}\ncall: {call}\n"
    if parser == "mistral":
        more = ' (", " call)*' if parallel else ""
        return f'start: "[TOOL_CALLS][" call{more} "]"\ncall: {call}\n'
    raise ValueError(f"no constrained tool calls for the {parser!r} format; use hermes, "
                     f"llama3_json or mistral")  # fmt: skip
