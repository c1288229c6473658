"""What a request asks its output to match: OpenAI's ``response_format`` (``json_object``,
``json_schema``), vLLM's ``structured_outputs`` (``json``, ``json_object``, ``regex``,
``choice``, ``grammar``) and ``tool_choice`` "required" (one or more calls, one with
``parallel_tool_calls`` false) or a named function (one call to it): the reply is then made of
calls in the served parser's format, their arguments following the functions' schemas.

At most one of them may constrain a request. A malformed field, or a schema, regex or grammar
the grammar library refuses, is a 400 naming the field (code ``invalid_structured_output``).
"""

from __future__ import annotations

from typing import Any

from prefixcache.engine.structured_output import StructuredOutput, StructuredOutputError
from prefixcache.engine.tool_prompt import tool_call_grammar
from prefixcache.integrations.server import protocol as p
from prefixcache.integrations.server.errors import ApiError, bad_request
from prefixcache.integrations.server.state import ServerState

INVALID_CODE = "invalid_structured_output"
STRUCTURED_KEYS = ("json", "json_object", "regex", "choice", "grammar")


def requested_structure(state: ServerState, body: p.SamplingFields, parser: str | None = None
                        ) -> tuple[StructuredOutput | None, str | None]:
    """``(spec, field)``: the structured output ``body`` asks for and the field that asked,
    checked by the grammar library (compiled and cached); ``(None, None)`` when it asks for
    none. ``parser``: the tool-call format of the served model (chat requests)."""
    found: list[tuple[StructuredOutput, str]] = []
    if body.structured_outputs is not None:
        found.append((_from_structured_outputs(body.structured_outputs), "structured_outputs"))
    if isinstance(body, p.ChatCompletionRequest):
        if body.response_format is not None:
            spec = _from_response_format(body.response_format)
            if spec is not None:
                found.append((spec, "response_format"))
        spec = _from_tool_choice(body, parser)
        if spec is not None:
            found.append((spec, "tool_choice"))
    if not found:
        return None, None
    if len(found) > 1:
        names = " and ".join(name for _, name in found)
        raise bad_request(f"{names} both constrain the output; give one", param=found[1][1],
                          code=INVALID_CODE)  # fmt: skip
    spec, field = found[0]
    try:
        state.engine.llm.grammars.check(spec)
    except StructuredOutputError as error:
        raise bad_request(f"{field}: the grammar library refused it: {error}", param=field,
                          code=INVALID_CODE) from error  # fmt: skip
    return spec, field


def _from_structured_outputs(value: dict[str, Any]) -> StructuredOutput:
    given = {key: value[key] for key in STRUCTURED_KEYS if value.get(key) not in (None, False)}
    unknown = sorted(set(value) - set(STRUCTURED_KEYS))
    if unknown:
        raise _invalid("structured_outputs", f"unknown key {unknown[0]!r}; it takes one of "
                                             f"{', '.join(STRUCTURED_KEYS)}")  # fmt: skip
    if len(given) != 1:
        raise _invalid("structured_outputs", f"give exactly one of {', '.join(STRUCTURED_KEYS)}")
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
        raise _invalid("structured_outputs", str(error)) from error


def _from_response_format(value: dict[str, Any]) -> StructuredOutput | None:
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind == "json_schema":
        described = value.get("json_schema")
        if not isinstance(described, dict) or not isinstance(described.get("schema"), dict):
            raise _invalid("response_format", "a json_schema response_format needs "
                                              "{'json_schema': {'name': ..., 'schema': {...}}}")
        return StructuredOutput(json=described["schema"])
    raise _invalid("response_format", f"type must be text, json_object or json_schema, got "
                                      f"{kind!r}")  # fmt: skip


def _from_tool_choice(body: p.ChatCompletionRequest, parser: str | None) -> StructuredOutput | None:
    choice = body.tool_choice
    if choice in (None, "none", "auto"):
        return None
    if not body.tools:
        raise _invalid("tool_choice", "tool_choice requires tools")
    only = choice.function.name if isinstance(choice, p.NamedToolChoice) else None
    try:  # a named function is called once (as vLLM does); "required": one or more calls
        grammar = tool_call_grammar(body.tools, parser or "hermes", only=only,
                                    parallel=body.parallel_tool_calls and only is None)
    except ValueError as error:
        raise _invalid("tool_choice", str(error)) from error
    return StructuredOutput(grammar=grammar)


def _invalid(field: str, message: str) -> ApiError:
    return bad_request(f"{field}: {message}", param=field, code=INVALID_CODE)

