"""Explicit cache control for agents, as Anthropic's API and OpenRouter take it, plus OpenAI's
own fields.

* ``cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}`` on a message, or on a content
  part of one, pins the prompt's prefix through that point for the TTL (5 minutes by default),
  then lets it go (``TtlPins``); several breakpoints pin nested prefixes, each for its own TTL.
* OpenAI's ``prompt_cache_retention``: ``"24h"`` pins the whole prompt for a day,
  ``"in_memory"`` (its default) changes nothing. ``prompt_cache_key`` is accepted for the
  router to place requests by; one replica needs nothing of it.

The prefix of a breakpoint is the chat template's text of the messages through it, tokenized;
where tokenization at the seam differs from the whole prompt's, the common prefix is pinned.
Pins are made once the request has run (its blocks are cached then), through the engine
thread; a tenant (salt) past its pin budget is refused up front: 429 ``pin_budget_exceeded``.
The response's usage reports ``cache_creation_input_tokens``: the pinned prompt tokens this
request computed (the rest were hits, ``prompt_tokens_details.cached_tokens``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixcache.integrations.server import protocol as p
from prefixcache.integrations.server.engine_calls import call_engine
from prefixcache.integrations.server.errors import ApiError, bad_request
from prefixcache.integrations.server.prompt_encoding import on_prompt_thread
from prefixcache.integrations.server.state import ServerState
from prefixcache.ttl_pins import PinBudgetExceeded

log = logging.getLogger(__name__)

TTLS = {"5m": 300.0, "1h": 3600.0}
RETENTIONS = {"in_memory": None, "in-memory": None, "24h": 86400.0}
BUDGET_CODE = "pin_budget_exceeded"


@dataclass(frozen=True)
class PinRequest:
    """Pin ``tokens`` (a prefix of the prompt) for ``ttl`` seconds once the request ran."""

    tokens: tuple[int, ...]
    ttl: float


def _breakpoints(messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, int | None, float]]:
    """``(message index, content part index or None, ttl)`` of every cache_control marker;
    400 naming ``messages`` for a malformed one."""
    found = []
    for i, message in enumerate(messages):
        marks = [(None, message.get("cache_control"))]
        content = message.get("content")
        if isinstance(content, list):
            marks += [(j, part.get("cache_control")) for j, part in enumerate(content)
                      if isinstance(part, Mapping)]  # fmt: skip
        for j, mark in marks:
            if mark is None:
                continue
            if not isinstance(mark, Mapping) or mark.get("type") != "ephemeral":
                raise bad_request(f"messages[{i}]: cache_control must be {{'type': "
                                  f"'ephemeral', 'ttl': '5m' | '1h'}}", param="messages")
            ttl = mark.get("ttl", "5m")
            if ttl not in TTLS:
                raise bad_request(f"messages[{i}]: cache_control ttl must be 5m or 1h, got "
                                  f"{ttl!r}", param="messages")  # fmt: skip
            found.append((i, j, TTLS[ttl]))
    return found


def _through(messages: Sequence[Mapping[str, Any]], i: int, j: int | None) -> list[dict]:
    """The messages through message ``i`` (its content parts through ``j`` when given)."""
    head = [dict(m) for m in messages[:i]]
    last = dict(messages[i])
    if j is not None:
        last["content"] = list(last["content"])[: j + 1]
    return [*head, last]


async def pin_requests(state: ServerState, body: p.ChatCompletionRequest,
                       prompt_ids: list[int]) -> list[PinRequest]:
    """What ``body`` asks to pin of its prompt (``prompt_ids``)."""
    pins = []
    llm = state.engine.llm
    for i, j, ttl in _breakpoints(body.messages):
        messages = _through(body.messages, i, j)

        def prefix_ids(messages: list[dict] = messages) -> list[int]:
            text = llm.chat_template.render(messages, add_generation_prompt=False,
                                            tools=body.tools)  # fmt: skip
            return llm.tokenizer.encode(text)

        ids = await on_prompt_thread(prefix_ids)
        common = 0
        for a, b in zip(ids, prompt_ids, strict=False):
            if a != b:
                break
            common += 1
        if common:
            pins.append(PinRequest(tuple(prompt_ids[:common]), ttl))
    retention = body.model_extra.get("prompt_cache_retention") if body.model_extra else None
    if retention is not None:
        if retention not in RETENTIONS:
            raise bad_request(f"prompt_cache_retention must be one of {list(RETENTIONS)}, got "
                              f"{retention!r}", param="prompt_cache_retention")  # fmt: skip
        if RETENTIONS[retention] is not None:
            pins.append(PinRequest(tuple(prompt_ids), RETENTIONS[retention]))
    return pins


async def check_pin_budget(state: ServerState, salt: str | None,
                           pins: Sequence[PinRequest]) -> None:
    """429 ``pin_budget_exceeded`` when the salt's pins could not take these."""
    if not pins:
        return

    def check(llm: Any) -> None:
        llm.ttl_pins.check_room(salt, sum(len(pin.tokens) for pin in pins))

    try:
        await call_engine(state, check)
    except PinBudgetExceeded as error:
        raise ApiError(429, str(error), code=BUDGET_CODE) from error


async def apply_pins(state: ServerState, salt: str | None, pins: Sequence[PinRequest]) -> None:
    """Pin what was asked for (the request has run: its prefix is cached). A pin the budget
    no longer takes (other requests pinned meanwhile) is skipped with a warning."""
    if not pins:
        return

    def pin(llm: Any) -> None:
        for request in pins:
            try:
                llm.ttl_pins.pin(list(request.tokens), salt, request.ttl)
            except PinBudgetExceeded as error:
                log.warning("a cache_control pin was not made: %s", error)

    await call_engine(state, pin)


def created_tokens(pins: Sequence[PinRequest], cached_tokens: int) -> int:
    """The pinned prompt tokens a request computed itself (``cache_creation_input_tokens``)."""
    longest = max((len(pin.tokens) for pin in pins), default=0)
    return max(0, longest - cached_tokens)
