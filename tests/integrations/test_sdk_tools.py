"""Tool calls and structured outputs through the SDK (HTTP ``Client`` and ``LocalClient``),
an agent ``Session`` with native tools, and the LangChain adapter's ``bind_tools`` /
``with_structured_output`` / streaming call chunks, against a live server on a tiny model
(its calls are well formed because the grammar makes them so)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest
from integration_helpers import SERVED_NAME, make_llm
from pydantic import BaseModel, ConfigDict, Field

from prefixcache.integrations.adapters.langchain_chat import PrefixCacheChatModel
from prefixcache.integrations.sdk import APIError, APITimeoutError, Client, LocalClient, Session
from prefixcache.integrations.sdk.results import Completion
from prefixcache.integrations.server import BackgroundServer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10}}, "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "weather in Oslo?"}]


class Answer(BaseModel):
    """An answer."""

    model_config = ConfigDict(extra="forbid")  # a closed schema: a small model cannot wander
    word: str = Field(max_length=6)
    score: int = Field(ge=0, le=9)


class WeatherArgs(BaseModel):
    city: Literal["Oslo", "Paris"]  # an enum: even a random model ends the string


def check_call(call: dict) -> None:
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert set(json.loads(call["function"]["arguments"])) == {"city"}


@pytest.fixture(scope="module")
def local(tiny_tools_dir: Path) -> LocalClient:
    return LocalClient(make_llm(tiny_tools_dir, num_blocks=1024, block_size=16))


@pytest.fixture
def http(tools_server: BackgroundServer) -> Client:
    return Client(tools_server.base_url, model=SERVED_NAME)


@pytest.mark.parametrize("which", ["http", "local"])
def test_clients_return_parsed_calls_whole_and_streamed(which: str, request) -> None:
    client = request.getfixturevalue(which)
    options = dict(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                   max_tokens=200, temperature=0)  # fmt: skip
    whole = client.chat(MESSAGES, **options)
    assert whole.finish_reason == "tool_calls" and len(whole.tool_calls) == 1
    check_call(whole.tool_calls[0])
    pieces = list(client.stream(messages=MESSAGES, **options))
    assert pieces[-1].finish_reason == "tool_calls" and pieces[-1].usage is not None
    deltas = [d for piece in pieces for d in piece.tool_calls]
    name = "".join(d.get("function", {}).get("name") or "" for d in deltas)
    arguments = "".join(d.get("function", {}).get("arguments") or "" for d in deltas)
    assert name == "get_weather"
    assert arguments == whole.tool_calls[0]["function"]["arguments"]
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    shaped = client.chat(MESSAGES, max_tokens=100, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert set(json.loads(shaped.text)) == {"n"}


def test_a_session_with_native_tools_keeps_its_prefix(local: LocalClient) -> None:
    session = Session(local, "Be brief.", [WEATHER], native_tools=True, max_tokens=200,
                      temperature=0)  # fmt: skip
    first = session.ask("weather in Oslo?", tool_choice="required", parallel_tool_calls=False)
    (call,) = first.tool_calls
    check_call(call)
    assert call["function"]["arguments"] == json.dumps(
        json.loads(call["function"]["arguments"]), sort_keys=True, separators=(",", ":"))
    assert session.messages[-1]["tool_calls"][0]["id"] == call["id"]
    session.add_tool_result("get_weather", {"sky": "snow", "c": -3}, call_id=call["id"])
    second = session.respond(max_tokens=3)
    # everything up to the reply the model wrote comes from the cache
    assert second.cached_tokens >= first.prompt_tokens - 16
    assert session.messages[0] == {"role": "system", "content": "Be brief."}
    branch = session.fork()
    assert branch.ask("and tomorrow?", max_tokens=2).cached_tokens > first.prompt_tokens


def test_langchain_bind_tools_and_streamed_call_chunks(tools_server: BackgroundServer) -> None:
    chat = PrefixCacheChatModel(base_url=tools_server.base_url, model=SERVED_NAME,
                                max_tokens=200, temperature=0)  # fmt: skip
    bound = chat.bind_tools([WEATHER], tool_choice="get_weather")
    message = bound.invoke("weather in Oslo?")
    (call,) = message.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city"}
    assert message.response_metadata["model_name"] == SERVED_NAME
    assert message.usage_metadata["input_tokens"] > 0
    gathered = None
    for chunk in bound.stream("weather in Oslo?"):
        gathered = chunk if gathered is None else gathered + chunk
    assert [c["name"] for c in gathered.tool_calls] == ["get_weather"]
    assert gathered.tool_calls[0]["args"] == call["args"]
    assert chat._get_ls_params()["ls_model_name"] == SERVED_NAME


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_langchain_with_structured_output(tools_server: BackgroundServer, method: str) -> None:
    chat = PrefixCacheChatModel(base_url=tools_server.base_url, model=SERVED_NAME,
                                max_tokens=200, temperature=0)  # fmt: skip
    if method == "json_mode":  # any JSON object: a dict (a model would follow the prompt)
        result = chat.with_structured_output(Answer.model_json_schema(),
                                             method=method).invoke("answer")  # fmt: skip
        assert isinstance(result, dict)
        return
    result = chat.with_structured_output(Answer, method=method).invoke("answer")
    assert isinstance(result, Answer)
    raw = chat.with_structured_output(Answer, method=method, include_raw=True).invoke("answer")
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], Answer)


def test_langchain_honours_stop_timeout_and_retries(tools_server: BackgroundServer,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    slow = PrefixCacheChatModel(base_url=tools_server.base_url, model=SERVED_NAME,
                                max_tokens=2000, timeout=0.001, max_retries=0)  # fmt: skip
    with pytest.raises(APITimeoutError):
        slow.invoke("go on and on")

    class Flaky:
        """A client whose first call fails as an overloaded server's does."""

        calls = 0

        def chat(self, messages, **options) -> Completion:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise APIError(503, "engine busy")
            assert options["stop"] == ["STOP", "END"]
            return Completion(["fine"], ["stop"])

    chat = PrefixCacheChatModel(client=Flaky(), stop=["STOP"], max_retries=1)
    assert chat.invoke("hi", stop=["END"]).content == "fine" and Flaky.calls == 2
    monkeypatch.delenv("PREFIXCACHE_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="client or a base_url"):
        PrefixCacheChatModel()


def test_llamaindex_function_calling(tools_server: BackgroundServer) -> None:
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.core.tools import FunctionTool

    from prefixcache.integrations.adapters.llamaindex_llm import PrefixCacheLLM

    seen = []

    def get_weather(city: str) -> str:
        """The weather of a city."""
        seen.append(city)
        return "snow"

    tool = FunctionTool.from_defaults(fn=get_weather, fn_schema=WeatherArgs)
    llm = PrefixCacheLLM.from_url(tools_server.base_url, model=SERVED_NAME, max_tokens=200,
                                  temperature=0)  # fmt: skip
    assert llm.metadata.is_function_calling_model
    output = llm.predict_and_call([tool], "weather in Oslo?", tool_required=True)
    assert output.response == "snow" and len(seen) == 1
    streamed = list(llm.stream_chat_with_tools([tool], "weather in Oslo?", tool_required=True))
    (selection,) = llm.get_tool_calls_from_response(streamed[-1])
    assert selection.tool_name == "get_weather" and set(selection.tool_kwargs) == {"city"}
    history = [ChatMessage(role="user", content="weather in Oslo?"), streamed[-1].message,
               ChatMessage(role="tool", content="snow",
                           additional_kwargs={"tool_call_id": selection.tool_id})]
    again = llm.chat(history, max_tokens=2)  # the call and its result go back into the prompt
    assert again.raw["usage"]["cached_tokens"] > 0
