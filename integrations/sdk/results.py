"""What every SDK client returns, whatever the transport: completions, chunks, usage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Usage:
    """Token counts of one call; ``cached_tokens`` prompt tokens were served from the cache."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_openai(cls, usage: dict[str, Any] | None) -> Usage:
        """From an OpenAI ``usage`` object (``prompt_tokens_details`` may be absent)."""
        if not usage:
            return cls()
        details = usage.get("prompt_tokens_details") or {}
        return cls(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
        )


ToolCall = dict[str, Any]
"""A call as OpenAI sends one: ``{"id", "type": "function", "function": {"name",
"arguments"}}``, the arguments the JSON text of an object."""


@dataclass(frozen=True)
class Completion:
    """A finished call: ``texts[i]`` is choice ``i``; ``text`` is the first. A chat reply's
    calls are ``choice_tool_calls[i]`` (``tool_calls``: the first choice's; empty without)."""

    texts: list[str]
    finish_reasons: list[str | None]
    usage: Usage = field(default_factory=Usage)
    choice_tool_calls: list[list[ToolCall]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.texts[0]

    @property
    def finish_reason(self) -> str | None:
        return self.finish_reasons[0]

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.choice_tool_calls[0] if self.choice_tool_calls else []

    @classmethod
    def from_openai(cls, body: dict[str, Any]) -> Completion:
        """From a /v1/completions or /v1/chat/completions response body."""
        choices = sorted(body["choices"], key=lambda choice: choice["index"])
        texts = [
            choice["text"] if "text" in choice else (choice["message"].get("content") or "")
            for choice in choices
        ]
        calls = [list((choice.get("message") or {}).get("tool_calls") or []) for choice in choices]
        return cls(texts, [c.get("finish_reason") for c in choices],
                   Usage.from_openai(body.get("usage")), calls if any(calls) else [])


@dataclass(frozen=True)
class Chunk:
    """One streamed piece of choice 0: new ``text`` and call deltas (``tool_calls``, as
    OpenAI streams them: ``{"index", "id"?, "type"?, "function": {"name"?, "arguments"?}}``);
    the last chunk, and only it, has ``finish_reason`` and, where the server reports it,
    ``usage``."""

    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
