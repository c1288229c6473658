"""Agent ``Session``: an append-only conversation whose every turn extends the last prefix.

The system prompt and the tool schemas come first, serialized canonically (sorted-key JSON),
and history is only ever appended — never edited, reordered or re-serialized — so each turn's
prompt starts with the previous turn's prompt plus its reply, and the server finds it cached.
``fork()`` makes a branch that shares the history so far (and so its cached blocks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prefixcache.integrations.sdk.canonical import canonical_json, canonical_text
from prefixcache.integrations.sdk.results import Completion


class ChatClient(Protocol):
    """What a session needs: ``Client``, ``LocalClient`` (or anything with this ``chat``)."""

    def chat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> Completion: ...


@dataclass(frozen=True)
class Turn:
    """One model call: the reply and how much of its prompt was served from the cache."""

    reply: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def system_message(system: str, tools: Sequence[Mapping[str, Any]] = ()) -> dict[str, str]:
    """The first message: the system text, then each tool schema as canonical JSON, in the
    given order (one per line)."""
    parts = [canonical_text(system)]
    if tools:
        parts.append("# Tools\n" + "\n".join(canonical_json(dict(tool)) for tool in tools))
    return {"role": "system", "content": "\n\n".join(p for p in parts if p)}


class Session:
    """An append-only chat with per-turn cache accounting.

    ``ask(text)`` appends a user message, calls the model, appends its reply verbatim and
    returns the ``Turn``. ``add_tool_result`` appends a tool message whose content is the
    canonical JSON of the result. ``options`` (max_tokens, temperature, salt...) apply to
    every call."""

    def __init__(self, client: ChatClient, system: str = "",
                 tools: Sequence[Mapping[str, Any]] = (), **options: Any) -> None:
        self.client = client
        self.options = options
        self._messages: list[dict[str, Any]] = []
        if system or tools:
            self._messages.append(system_message(system, tools))
        self.turns: list[Turn] = []

    @property
    def messages(self) -> list[dict[str, Any]]:
        """A copy of the history (editing it does not change the session)."""
        return [dict(message) for message in self._messages]

    def add_user(self, text: str) -> None:
        self._messages.append({"role": "user", "content": text})

    def add_tool_result(self, name: str, result: Any, call_id: str | None = None) -> None:
        """Append a tool's result; ``result`` is serialized as canonical JSON."""
        message: dict[str, Any] = {"role": "tool", "name": name,
                                   "content": canonical_json(result)}
        if call_id is not None:
            message["tool_call_id"] = call_id
        self._messages.append(message)

    def respond(self, **options: Any) -> Turn:
        """Call the model on the history; its reply is appended exactly as returned."""
        completion = self.client.chat(self._messages, **{**self.options, **options})
        self._messages.append({"role": "assistant", "content": completion.text})
        usage = completion.usage
        turn = Turn(completion.text, usage.prompt_tokens, usage.cached_tokens,
                    usage.completion_tokens, completion.finish_reason)
        self.turns.append(turn)
        return turn

    def ask(self, text: str, **options: Any) -> Turn:
        """``add_user(text)`` then ``respond()``."""
        self.add_user(text)
        return self.respond(**options)

    def fork(self) -> Session:
        """A branch with the same history and options; the two diverge from here on."""
        branch = Session(self.client, **self.options)
        branch._messages = [dict(message) for message in self._messages]
        return branch
