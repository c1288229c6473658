"""An agent ``Session``: tool schemas and results serialized canonically, history append-only,
so each turn's prompt extends the last one and is mostly served from the cache.

    python examples/agent_session.py [--model smollm2]
"""

from __future__ import annotations

import argparse

from prefixcache.engine.llm import LLM
from prefixcache.integrations.sdk import LocalClient, Session

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--num-blocks", type=int, default=None, help="KV pool size in blocks")
    args = parser.parse_args(argv)
    llm = LLM(args.model, num_blocks=args.num_blocks)
    session = Session(LocalClient(llm), "You are a travel assistant.", TOOLS, max_tokens=16,
                      temperature=0)
    session.ask("What is the weather in Paris?")
    session.add_tool_result("get_weather", {"city": "Paris", "sky": "clear", "temp_c": 18})
    session.respond()
    branch = session.fork()  # shares every cached block of the conversation so far
    session.ask("Should I take a coat?")
    branch.ask("And what about Rome?")
    for name, agent in (("main", session), ("branch", branch)):
        for number, turn in enumerate(agent.turns, 1):
            print(f"{name} turn {number}: {turn.cached_tokens}/{turn.prompt_tokens} prompt "
                  f"tokens cached -> {turn.reply!r}")


if __name__ == "__main__":
    main()
