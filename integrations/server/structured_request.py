"""What a request asks its output to match (``openai_structure``), checked by the grammar
library: a malformed field, two constraints at once, or a schema, regex or grammar the library
refuses, is a 400 naming the field (code ``invalid_structured_output``)."""

from __future__ import annotations

from prefixcache.engine.structured_output import StructuredOutput, StructuredOutputError
from prefixcache.integrations.openai_structure import FieldError, structure_of
from prefixcache.integrations.server import protocol as p
from prefixcache.integrations.server.errors import bad_request
from prefixcache.integrations.server.state import ServerState

INVALID_CODE = "invalid_structured_output"


def requested_structure(state: ServerState, body: p.SamplingFields, parser: str | None = None
                        ) -> tuple[StructuredOutput | None, str | None]:
    """``(spec, field)``: the structured output ``body`` asks for and the field that asked,
    compiled (and cached) by the grammar library; ``(None, None)`` when it asks for none.
    ``parser``: the tool-call format of the served model (chat requests)."""
    chat = isinstance(body, p.ChatCompletionRequest)
    try:
        spec, field = structure_of(
            structured_outputs=body.structured_outputs,
            response_format=body.response_format if chat else None,
            tools=body.tools if chat else None,
            tool_choice=_plain(body.tool_choice) if chat else None,
            parallel_tool_calls=body.parallel_tool_calls if chat else True,
            parser=parser or "hermes",
        )
    except FieldError as error:
        raise bad_request(str(error), param=error.field, code=INVALID_CODE) from error
    if spec is None:
        return None, None
    try:
        state.engine.llm.grammars.check(spec)
    except StructuredOutputError as error:
        raise bad_request(f"{field}: the grammar library refused it: {error}", param=field,
                          code=INVALID_CODE) from error  # fmt: skip
    return spec, field


def _plain(choice: object) -> object:
    return choice.model_dump() if isinstance(choice, p.NamedToolChoice) else choice
