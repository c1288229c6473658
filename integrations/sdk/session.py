"""Agent ``Session``: an append-only conversation whose every turn extends the last prefix.

The system prompt and the tool schemas come first, serialized canonically (sorted-key JSON),
and history is only ever appended — never edited, reordered or re-serialized — so each turn's
prompt starts with the previous turn's prompt plus its reply, and the server finds it cached.
``fork()`` makes a branch that shares the history so far (and so its cached blocks).
"""

from __future__ import annotations

import contextlib
import json
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
    """One model call: the reply (its text and, with native tools, its calls) and how much of
    its prompt was served from the cache."""

    reply: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None
    tool_calls: tuple[dict[str, Any], ...] = ()

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


Content = str | list[dict[str, Any]]


def check_tools(tools: Any) -> list[Mapping[str, Any]]:
    """``tools`` as a list of tool schemas (None: no tools); TypeError unless it is a
    sequence (a list, a tuple) of mappings — a single schema must be wrapped in a list."""
    if tools is None:
        return []
    if isinstance(tools, Mapping):
        raise TypeError("tools must be a list of tool schemas (dicts), got a single "
                        f"{type(tools).__name__}; wrap it in a list")
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise TypeError("tools must be a list of tool schemas (dicts), got "
                        f"{type(tools).__name__}")
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise TypeError(f"tools[{index}] must be a tool schema (a dict), got "
                            f"{type(tool).__name__} {tool!r}")
    return list(tools)


def checked_content(content: Any) -> Content:
    """A copy of a user message's ``content`` as the chat template accepts it: a string, or
    a list of OpenAI text parts ``{"type": "text", "text": str}`` (extra keys kept). The copy
    keeps later edits of the caller's list out of the history. TypeError for another type,
    ValueError for a part that is not a text part."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TypeError("message content must be a string or a list of text parts, got "
                        f"{type(content).__name__} {content!r}")
    parts = []
    for index, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") != "text":
            raise ValueError(f"content part {index} must be a text part "
                             f"{{'type': 'text', 'text': ...}}, got {part!r}")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"content part {index} needs a string 'text', got {part!r}")
        parts.append(dict(part))
    return parts


def system_message(system: str, tools: Sequence[Mapping[str, Any]] | None = ()
                   ) -> dict[str, str]:
    """The first message: the system text, then each tool schema as canonical JSON, in the
    given order (one per line). TypeError for a system that is not a string or tools that
    are not a list of dicts (see ``check_tools``)."""
    if not isinstance(system, str):
        raise TypeError(f"system must be a string, got {type(system).__name__}")
    tools = check_tools(tools)
    parts = [canonical_text(system)]
    if tools:
        parts.append("# Tools\n" + "\n".join(canonical_json(dict(tool)) for tool in tools))
    return {"role": "system", "content": "\n\n".join(p for p in parts if p)}


def user_message(text: Content) -> dict[str, Any]:
    """A user message with checked content (see ``checked_content``)."""
    return {"role": "user", "content": checked_content(text)}


def copy_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a history message that shares no list of content parts with it."""
    copy = dict(message)
    if isinstance(copy.get("content"), list):
        copy["content"] = [dict(part) for part in copy["content"]]
    return copy


class Session:
    """An append-only chat with per-turn cache accounting.

    ``ask(text)`` calls the model on the history plus a user message and, once the call has
    succeeded, appends that message and the reply (verbatim) and returns the ``Turn``; a
    failed call appends nothing, so it can simply be retried. ``add_tool_result`` appends a
    tool message whose content is the canonical JSON of the result. Every ``add_*`` checks
    its input before appending: what cannot be rendered never enters the history. ``options``
    (max_tokens, temperature, salt...) apply to every call.

    ``tools`` are written into the system message as canonical JSON, which any server and any
    template take. With ``native_tools`` they go to the server as OpenAI's ``tools`` instead
    (canonical, so every call renders them the same): the model's calls come back parsed
    (``Turn.tool_calls``; ``tool_choice`` and ``parallel_tool_calls`` pass as options) and
    join the history as an assistant message with ``tool_calls``, arguments canonical."""

    def __init__(self, client: ChatClient, system: str = "",
                 tools: Sequence[Mapping[str, Any]] | None = (), *,
                 native_tools: bool = False, **options: Any) -> None:  # fmt: skip
        self.client = client
        self.options = options
        self.native_tools = native_tools
        checked = check_tools(tools)
        self._tools = [json.loads(canonical_json(dict(t))) for t in checked] if native_tools \
            else []  # fmt: skip
        self._messages: list[dict[str, Any]] = []
        shown = () if native_tools else checked
        if system or shown:
            self._messages.append(system_message(system, shown))
        self.turns: list[Turn] = []

    @property
    def messages(self) -> list[dict[str, Any]]:
        """A copy of the history (editing it does not change the session)."""
        return [copy_message(message) for message in self._messages]

    def add_user(self, text: Content) -> None:
        """Append a user message: ``text`` a string or a list of text parts (checked and
        copied by ``checked_content``; nothing is appended if it raises)."""
        self._messages.append(user_message(text))

    def add_tool_result(self, name: str, result: Any, call_id: str | None = None) -> None:
        """Append a tool's result; ``result`` is serialized as canonical JSON (TypeError or
        ValueError from ``canonical_json``, or for a ``name`` / ``call_id`` that is not a
        string, and nothing is appended)."""
        if not isinstance(name, str):
            raise TypeError(f"tool name must be a string, got {type(name).__name__}")
        if call_id is not None and not isinstance(call_id, str):
            raise TypeError(f"call_id must be a string or None, got {type(call_id).__name__}")
        message: dict[str, Any] = {"role": "tool", "name": name,
                                   "content": canonical_json(result)}
        if call_id is not None:
            message["tool_call_id"] = call_id
        self._messages.append(message)

    def respond(self, **options: Any) -> Turn:
        """Call the model on the history; its reply is appended exactly as returned (nothing
        is appended if the call raises)."""
        return self._call([], options)

    def ask(self, text: Content, **options: Any) -> Turn:
        """Like ``add_user(text)`` then ``respond()``, except that the user message is
        appended only with the reply: if the call raises, the history is as it was."""
        return self._call([user_message(text)], options)

    def _call(self, pending: list[dict[str, Any]], options: Mapping[str, Any]) -> Turn:
        """Call the model on the history plus ``pending``; on success append ``pending`` and
        the reply, record and return the ``Turn``."""
        tools = {"tools": self._tools} if self._tools else {}
        completion = self.client.chat([*self._messages, *pending],
                                      **{**tools, **self.options, **options})
        reply: dict[str, Any] = {"role": "assistant", "content": completion.text}
        calls = tuple(canonical_call(call) for call in completion.tool_calls)
        if calls:
            reply = {"role": "assistant", "content": completion.text or None,
                     "tool_calls": [dict(call) for call in calls]}  # fmt: skip
        self._messages.extend([*pending, reply])
        usage = completion.usage
        turn = Turn(completion.text, usage.prompt_tokens, usage.cached_tokens,
                    usage.completion_tokens, completion.finish_reason, calls)
        self.turns.append(turn)
        return turn

    def fork(self) -> Session:
        """A branch with the same history, tools and options; the two diverge from here on."""
        branch = Session(self.client, native_tools=self.native_tools, **self.options)
        branch._tools = [dict(tool) for tool in self._tools]
        branch._messages = [copy_message(message) for message in self._messages]
        return branch


def canonical_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call with its arguments as canonical JSON (arguments that are not JSON
    are kept as they are)."""
    function = dict(call.get("function") or {})
    arguments = function.get("arguments", "{}")
    with contextlib.suppress(TypeError, ValueError):  # else kept as the model wrote them
        function["arguments"] = canonical_json(json.loads(arguments))
    return {"id": call.get("id"), "type": "function", "function": function}
