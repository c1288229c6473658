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


BAD_CONTENT = [5, None, b"bytes", ("tuple",), ["plain string part"],
               [{"type": "image_url", "image_url": {"url": "x"}}], [{"type": "text", "text": 3}]]


@pytest.mark.parametrize("content", BAD_CONTENT)
def test_bad_user_content_is_refused_before_it_enters_the_history(
        local: LocalClient, content) -> None:
    session = Session(local, "sys", max_tokens=2)
    before = session.messages
    with pytest.raises((TypeError, ValueError), match="content"):
        session.add_user(content)
    with pytest.raises((TypeError, ValueError), match="content"):
        session.ask(content)
    assert session.messages == before and session.turns == []
    session.ask("a real question")  # the session is still usable
    assert [m["role"] for m in session.messages] == ["system", "user", "assistant"]


def test_text_parts_are_accepted_and_copied(local: LocalClient, llm: LLM) -> None:
    parts = [{"type": "text", "text": "first "}, {"type": "text", "text": "second"}]
    session = Session(local, "sys", max_tokens=2)
    session.add_user(parts)
    parts[0]["text"] = "edited"
    parts.append({"type": "text", "text": "more"})
    assert session.messages[-1]["content"] == [{"type": "text", "text": "first "},
                                               {"type": "text", "text": "second"}]
    session.messages[-1]["content"].clear()  # a copy: the history is unchanged
    assert "first second" in llm.render_chat(session.messages)
    session.respond()


class FailingOnce:
    """Raises on the first chat, then answers through ``client``."""

    def __init__(self, client: LocalClient) -> None:
        self.client, self.failed = client, False

    def chat(self, messages, **options):
        if not self.failed:
            self.failed = True
            raise ConnectionError("server went away")
        return self.client.chat(messages, **options)


def test_a_failed_ask_leaves_the_history_as_it_was(local: LocalClient) -> None:
    session = Session(FailingOnce(local), "sys", max_tokens=2)
    with pytest.raises(ConnectionError):
        session.ask("question")
    assert session.messages == [{"role": "system", "content": "sys"}] and session.turns == []
    session.ask("question")  # the retry appends one user message, not two
    assert [m["role"] for m in session.messages] == ["system", "user", "assistant"]


def test_a_prompt_too_long_for_the_model_can_be_replaced(local: LocalClient) -> None:
    session = Session(local, "sys", max_tokens=2)
    with pytest.raises(ValueError):
        session.ask("The quick brown fox. " * 300)
    assert len(session.messages) == 1
    assert session.ask("short").prompt_tokens > 0


@pytest.mark.parametrize(("tools", "message"), [
    (["search"], r"tools\[0\] must be a tool schema \(a dict\), got str 'search'"),
    ({"type": "function"}, "got a single dict; wrap it in a list"),
    ("search", "tools must be a list of tool schemas"),
    (5, "tools must be a list of tool schemas"),
])
def test_bad_tools_are_a_clear_type_error(tools, message) -> None:
    with pytest.raises(TypeError, match=message):
        Session(None, "sys", tools)
    with pytest.raises(TypeError, match=message):
        system_message("sys", tools)


def test_no_tools() -> None:
    assert Session(None, "sys", None).messages == Session(None, "sys").messages
    with pytest.raises(TypeError, match="system must be a string"):
        Session(None, 5)


def test_a_bad_tool_result_appends_nothing() -> None:
    session = Session(None, "sys")
    with pytest.raises(TypeError, match="tool name must be a string"):
        session.add_tool_result(None, {"a": 1})
    with pytest.raises(TypeError, match="call_id must be a string"):
        session.add_tool_result("t", {"a": 1}, call_id=7)
    with pytest.raises(TypeError, match="not JSON serializable"):
        session.add_tool_result("t", {"a": {1, 2}})
    assert len(session.messages) == 1
