"""Tool calls and structured outputs through a live server and the official ``openai`` client.

The model is tiny and random: a reply is a call only because the grammar makes it one
(``tool_choice`` required or named, or a ``structured_outputs`` grammar under "auto"), which
is what these tests check — the calls parse, name a tool, and carry arguments that validate
against the tool's schema, whole or streamed; JSON outputs validate against their schema; and
every malformed request is a 400 naming its field."""

from __future__ import annotations

import json

import httpx
import jsonschema_rs
import openai
import pytest
from integration_helpers import SERVED_NAME, assert_openai_error, assert_server_clean
from openai.lib.streaming.chat import ChatCompletionStreamState

from prefixcache.engine.tool_prompt import tool_call_grammar
from prefixcache.integrations.server import BackgroundServer

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "unit"]}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 12}},
          "required": ["query"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "search", "parameters": SEARCH}}]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH}
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tools_server: BackgroundServer) -> BackgroundServer:
    return tools_server


@pytest.fixture
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def check_calls(tool_calls, only: str | None = None) -> None:
    assert tool_calls
    for call in tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in SCHEMAS and (only is None or call.function.name == only)
        jsonschema_rs.validator_for(SCHEMAS[call.function.name]).validate(
            json.loads(call.function.arguments))


@pytest.mark.parametrize("parallel", [True, False])
def test_required_tool_choice_makes_calls_that_validate(client: openai.OpenAI,
                                                        parallel: bool) -> None:  # fmt: skip
    reply = client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=parallel, max_tokens=300, temperature=0.7, seed=1)
    choice = reply.choices[0]
    check_calls(choice.message.tool_calls)
    if not parallel:
        assert len(choice.message.tool_calls) == 1
    if choice.finish_reason != "length":
        assert choice.finish_reason == "tool_calls"


def test_a_named_function_is_called_once_whole_or_streamed(client: openai.OpenAI,
                                                           server: BackgroundServer) -> None:
    named = {"type": "function", "function": {"name": "search"}}
    common = dict(model=SERVED_NAME, messages=MESSAGES, tools=TOOLS, tool_choice=named,
                  max_tokens=300, temperature=0)  # fmt: skip
    whole = client.chat.completions.create(**common).choices[0]
    assert whole.finish_reason == "tool_calls" and len(whole.message.tool_calls) == 1
    check_calls(whole.message.tool_calls, only="search")
    state = ChatCompletionStreamState()
    chunks = list(client.chat.completions.create(**common, stream=True))
    for chunk in chunks:
        state.handle_chunk(chunk)
    streamed = state.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes.count("tool_calls") == 1 and finishes[-1] == "tool_calls"
    assert_server_clean(server.base_url)


def test_auto_parses_a_reply_that_is_a_call(client: openai.OpenAI) -> None:
    """Under "auto" the reply is text unless it is a call: a grammar makes this tiny model
    write one (text first, then a Hermes block), and it comes back as content + tool_calls."""
    grammar = tool_call_grammar(TOOLS, "hermes", parallel=False).replace(
        "start: block", 'start: "On it.\\n" block')
    reply = client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, tools=TOOLS, max_tokens=300, temperature=0,
        extra_body={"structured_outputs": {"grammar": grammar}}).choices[0]
    assert reply.message.content == "On it." and reply.finish_reason == "tool_calls"
    check_calls(reply.message.tool_calls)
    free = client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, tools=TOOLS,
                                          max_tokens=8, temperature=0).choices[0]
    assert free.message.tool_calls is None and free.message.content is not None


def test_a_tool_turn_goes_back_into_the_prompt(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=300, temperature=0).choices[0].message
    turn = [*MESSAGES, first.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "18 C"}]
    again = client.chat.completions.create(model=SERVED_NAME, messages=turn, tools=TOOLS,
                                           max_tokens=4, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the tools and the first turn


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_and_json_object_outputs(client: openai.OpenAI, stream: bool) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9},
                                               "tag": {"type": "string", "maxLength": 5}},
              "required": ["n", "tag"], "additionalProperties": False}
    formats = [{"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}},
               {"type": "json_object"}]
    for response_format in formats:
        reply = client.chat.completions.create(
            model=SERVED_NAME, messages=MESSAGES, response_format=response_format,
            max_tokens=300, temperature=0, stream=stream)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
        else:
            text = reply.choices[0].message.content
        value = json.loads(text)
        if response_format["type"] == "json_schema":
            jsonschema_rs.validator_for(schema).validate(value)
        assert isinstance(value, dict)


def test_structured_outputs_on_completions(client: openai.OpenAI) -> None:
    for spec, check in [({"regex": "[a-c]{4}[0-9]"}, lambda t: len(t) == 5),
                        ({"choice": ["left", "right"]}, lambda t: t in ("left", "right"))]:
        text = client.completions.create(model=SERVED_NAME, prompt="pick", max_tokens=20,
                                         extra_body={"structured_outputs": spec}
                                         ).choices[0].text  # fmt: skip
        assert check(text), (spec, text)


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"structured_outputs": {"regex": "(open"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"made_up": 1}}, "structured_outputs"),
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
])  # fmt: skip
def test_malformed_requests_are_400_naming_the_field(server: BackgroundServer, extra: dict,
                                                      param: str) -> None:  # fmt: skip
    body = {"model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 4, **extra}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert_openai_error(response, 400, param)
    assert_server_clean(server.base_url)
