"""Render OpenAI-style chat messages into a prompt with the model's own Jinja template.

Mirrors transformers' `apply_chat_template` environment: sandboxed, `trim_blocks` and
`lstrip_blocks`, loop controls, `raise_exception`, `strftime_now`, a `tojson` filter that keeps
non-ASCII text, and the no-op `{% generation %}` block some templates use.

A template that never reads `tools` (SmolLM2-135M's) still takes tools, assistant tool calls
and tool results: they are written into its messages in the Hermes format
(`prefixcache.engine.tool_prompt.with_tool_turns`), which the `hermes` parser reads back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from prefixcache.engine.tool_prompt import with_tool_turns


class ChatTemplateError(ValueError):
    """The template failed to render (or called `raise_exception`)."""


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` renders its body unchanged."""

    tags = frozenset({"generation"})

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _flatten_content(content: Any) -> str:
    """A message's content as text: a string, OpenAI content parts `[{"type": "text", "text":
    ...}]` joined into one, or "" for null or no content (an assistant turn that only calls
    tools), as vLLM renders it, rather than the word "None"."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatTemplateError(
            f"content must be a string, a list of text parts or null, got {content!r}"
        )
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") != "text":
            raise ChatTemplateError(f"only text content parts are supported, got {part!r}")
        if not isinstance(part.get("text"), str):
            raise ChatTemplateError(f"a text content part needs a string 'text', got {part!r}")
        texts.append(part["text"])
    return "".join(texts)


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    def __init__(self, source: str, *, bos_token: str | None = None,
                 eos_token: str | None = None) -> None:
        if not isinstance(source, str) or not source:
            raise ValueError("chat template must be a non-empty string")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        environment = _environment()
        try:
            self._template = environment.from_string(source)
            variables = meta.find_undeclared_variables(environment.parse(source))
        except jinja2.exceptions.TemplateSyntaxError as error:
            raise ChatTemplateError(f"chat template does not compile: {error}") from error
        self.uses_tools = "tools" in variables

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, **extra: Any) -> str:
        """Prompt text for `messages` (dicts with "role" and "content").

        `add_generation_prompt` appends the header of the assistant's turn. Extra keyword
        arguments are passed to the template (e.g. `documents`, `enable_thinking`). `tools`
        (OpenAI's list) go to a template that reads them, else into the messages (module
        docstring); ValueError for a tool that is not a function.
        """
        if not self.uses_tools:
            messages = with_tool_turns(messages, tools)
            tools = None
        prepared = []
        for index, message in enumerate(messages):
            if not isinstance(message, Mapping) or "role" not in message:
                raise ChatTemplateError(f"each message needs a 'role', got {message!r}")
            if not isinstance(message["role"], str):
                raise ChatTemplateError(
                    f"message {index}: 'role' must be a string, got {message['role']!r}"
                )
            prepared.append({**message, "content": _flatten_content(message.get("content"))})
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, **extra}
        try:
            return self._template.render(messages=prepared, tools=tools,
                                         add_generation_prompt=add_generation_prompt, **context)
        except jinja2.exceptions.TemplateError as error:
            raise ChatTemplateError(f"chat template failed: {error}") from error
        except (TypeError, ValueError) as error:  # e.g. a template adding a number to text
            raise ChatTemplateError(f"chat template failed on these messages: {error}") from error


def chat_template_from_tokenizer_config(config: Mapping[str, Any], name: str = "default") -> \
        str | None:
    """The template source in a tokenizer_config.json (a string or a list of named ones)."""
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template}
        return named.get(name)
    return template
