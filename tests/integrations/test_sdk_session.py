"""Agent ``Session``: append-only history, canonical tool text, each turn's prompt extends the
last one exactly (and hits the cache), forks share the prefix."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration_helpers import assert_no_leak, make_llm

from prefixcache.engine.llm import LLM
from prefixcache.integrations.sdk import Client, LocalClient, Session
from prefixcache.integrations.sdk.session import system_message

BLOCK = 4
TOOLS = [
    {"type": "function", "function": {"name": "search", "description": "web search",
                                      "parameters": {"type": "object", "properties": {
                                          "query": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}},
]
SYSTEM = "You are a careful agent. Use tools when they help."


@pytest.fixture(scope="module")
def llm(tiny_chat_dir: Path) -> LLM:
    return make_llm(tiny_chat_dir)


@pytest.fixture()
def local(llm: LLM) -> Iterator[LocalClient]:
    llm.cache.reset()
    yield LocalClient(llm)
    assert_no_leak(llm)


def reordered(value):
    """The same JSON value with every dict's keys in reverse order."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


def test_tool_schemas_and_results_serialize_canonically() -> None:
    assert system_message(SYSTEM, TOOLS) == system_message(SYSTEM + "\r\n", reordered(TOOLS))
    one, two = Session(None, SYSTEM), Session(None, SYSTEM)
    one.add_tool_result("search", {"hits": [1, 2], "query": "x"}, call_id="c1")
    two.add_tool_result("search", {"query": "x", "hits": [1, 2]}, call_id="c1")
    assert one.messages == two.messages
    assert one.messages[-1]["content"] == '{"hits":[1,2],"query":"x"}'


def test_every_turn_extends_the_previous_prompt(local: LocalClient, llm: LLM) -> None:
    session = Session(local, "Be brief.", TOOLS[1:], max_tokens=6, temperature=1.0, seed=2)
    prompts = []
    for step, text in enumerate(["weather?", "add 2+2", "sum up"]):
        if step == 1:
            session.add_tool_result("search", {"sky": "sunny", "c": 21})
        prompts.append(llm.render_chat([*session.messages, {"role": "user", "content": text}]))
        session.ask(text)
    for earlier, later in itertools.pairwise(prompts):
        assert later.startswith(earlier)
    first, *rest = session.turns
    assert first.cached_tokens == 0
    previous_prompt_tokens = first.prompt_tokens
    for turn in rest:
        assert turn.cached_tokens >= (previous_prompt_tokens // BLOCK - 1) * BLOCK
        previous_prompt_tokens = turn.prompt_tokens
    assert [m["role"] for m in session.messages] == [
        "system", "user", "assistant", "tool", "user", "assistant", "user", "assistant"]


def test_fork_shares_the_prefix_and_diverges(local: LocalClient) -> None:
    trunk = Session(local, "Be brief.", TOOLS[1:], max_tokens=4, temperature=0.0)
    trunk.ask("plan the trip")
    shared = len(trunk.messages)
    branch = trunk.fork()
    left, right = trunk.ask("option A"), branch.ask("option B")
    assert left.cached_tokens >= (trunk.turns[0].prompt_tokens // BLOCK - 1) * BLOCK
    assert right.cached_tokens >= (trunk.turns[0].prompt_tokens // BLOCK - 1) * BLOCK
    assert trunk.messages[:shared] == branch.messages[:shared]
    assert trunk.messages[shared]["content"] == "option A"
    assert branch.messages[shared]["content"] == "option B"
    assert len(branch.turns) == 1 and len(trunk.turns) == 2


def test_session_over_http(server) -> None:
    with Client(server.base_url) as client:
        client.reset()
        session = Session(client, "Be brief.", TOOLS[1:], max_tokens=3, temperature=0.0)
        turns = [session.ask(q) for q in ("one", "two", "three")]
    assert turns[0].cached_tokens == 0
    assert all(t.cached_tokens > turns[0].prompt_tokens // 2 for t in turns[1:])
