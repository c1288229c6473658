"""From OpenAI's request fields to what the output must match, for any transport (the server,
the in-process SDK client): ``response_format`` (``json_object``, ``json_schema``), vLLM's
``structured_outputs`` (``json``, ``json_object``, ``regex``, ``choice``, ``grammar``) and
``tool_choice`` "required" (one or more calls, one with ``parallel_tool_calls`` false) or a
named function (one call to it), the calls in the served parser's format with their arguments
following the functions' schemas.

At most one of them may constrain a request. ``FieldError`` names the field at fault.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prefixcache.engine.structured_output import StructuredOutput
from prefixcache.engine.tool_prompt import tool_call_grammar

STRUCTURED_KEYS = ("json", "json_object", "regex", "choice", "grammar")


class FieldError(ValueError):
    """A request field that cannot be honoured as given (``field`` names it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def structure_of(*, structured_outputs: Mapping[str, Any] | None = None,
                 response_format: Mapping[str, Any] | None = None,
                 tools: Sequence[Mapping[str, Any]] | None = None,
                 tool_choice: str | Mapping[str, Any] | None = None,
                 parallel_tool_calls: bool = True,
                 parser: str = "hermes") -> tuple[StructuredOutput | None, str | None]:
    """``(spec, field)``: the structured output the fields ask for and the field that asked;
    ``(None, None)`` when none does. FieldError for a malformed field or two at once."""
    found: list[tuple[StructuredOutput, str]] = []
    if structured_outputs is not None:
        found.append((_from_structured_outputs(structured_outputs), "structured_outputs"))
    if response_format is not None:
        spec = _from_response_format(response_format)
        if spec is not None:
            found.append((spec, "response_format"))
    spec = _from_tool_choice(tools, tool_choice, parallel_tool_calls, parser)
    if spec is not None:
        found.append((spec, "tool_choice"))
    if len(found) > 1:
        names = " and ".join(name for _, name in found)
        raise FieldError(found[1][1], f"{names} both constrain the output; give one")
    return found[0] if found else (None, None)


def _from_structured_outputs(value: Mapping[str, Any]) -> StructuredOutput:
    if not isinstance(value, Mapping):
        raise FieldError("structured_outputs", "must be an object")
    unknown = sorted(set(value) - set(STRUCTURED_KEYS))
    if unknown:
        raise FieldError("structured_outputs", f"unknown key {unknown[0]!r}; it takes one of "
                                               f"{', '.join(STRUCTURED_KEYS)}")  # fmt: skip
    given = {key: value[key] for key in STRUCTURED_KEYS if value.get(key) not in (None, False)}
    if len(given) != 1:
        raise FieldError("structured_outputs", f"give exactly one of {', '.join(STRUCTURED_KEYS)}")
    key, spec = next(iter(given.items()))
    try:
        if key == "json_object":
            if spec is not True:
                raise TypeError("json_object must be true")
            return StructuredOutput(json_object=True)
        if key == "choice":
            if not isinstance(spec, list):
                raise TypeError("choice must be a list of strings")
            return StructuredOutput(choice=tuple(spec))
        return StructuredOutput(**{key: spec})
    except (TypeError, ValueError) as error:
        raise FieldError("structured_outputs", str(error)) from error


def _from_response_format(value: Mapping[str, Any]) -> StructuredOutput | None:
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind == "json_schema":
        described = value.get("json_schema")
        if not isinstance(described, Mapping) or not isinstance(described.get("schema"), Mapping):
            raise FieldError("response_format", "a json_schema response_format needs "
                                                "{'json_schema': {'name': ..., 'schema': {...}}}")
        return StructuredOutput(json=dict(described["schema"]))
    raise FieldError("response_format", f"type must be text, json_object or json_schema, got "
                                        f"{kind!r}")  # fmt: skip


def _from_tool_choice(tools: Sequence[Mapping[str, Any]] | None,
                      choice: str | Mapping[str, Any] | None, parallel: bool,
                      parser: str) -> StructuredOutput | None:  # fmt: skip
    if choice in (None, "none", "auto"):
        return None
    if isinstance(choice, str) and choice != "required":
        raise FieldError("tool_choice", f"must be none, auto, required or a named function, "
                                        f"got {choice!r}")  # fmt: skip
    if not tools:
        raise FieldError("tool_choice", "tool_choice requires tools")
    only = None
    if isinstance(choice, Mapping):
        function = choice.get("function")
        if choice.get("type") != "function" or not isinstance(function, Mapping) \
                or not isinstance(function.get("name"), str):  # fmt: skip
            raise FieldError("tool_choice", "a named tool_choice is {'type': 'function', "
                                            "'function': {'name': ...}}")
        only = function["name"]
    try:  # a named function is called once (as vLLM does); "required": one or more calls
        grammar = tool_call_grammar(tools, parser, only=only, parallel=parallel and only is None)
    except ValueError as error:
        raise FieldError("tool_choice", str(error)) from error
    return StructuredOutput(grammar=grammar)
