"""agent: interleaved multi-turn sessions. Every session starts from the same system prompt +
tool schemas; each turn appends the assistant's tool call and the tool's result, so a turn's
prompt is exactly the previous turn's prompt plus call_len + result_len tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixcache.integrations.bench.bench_request import BenchRequest
from prefixcache.integrations.bench.token_source import TokenRange, check_positive


@dataclass(frozen=True)
class AgentConfig:
    """Turn t (0-based) of a session has system_len + user_len + t * (call_len + result_len)
    prompt tokens."""

    num_sessions: int = 3
    turns_per_session: int = 3
    system_len: int = 256
    user_len: int = 32
    call_len: int = 32
    result_len: int = 96
    output_len: int = 8

    def __post_init__(self) -> None:
        check_positive(**self.__dict__)

    def prompt_len(self, turn: int) -> int:
        return self.system_len + self.user_len + turn * (self.call_len + self.result_len)


def build_agent(config: AgentConfig, seed: int, tokens: TokenRange) -> list[BenchRequest]:
    """Round-robin over sessions: turn 0 of every session, then turn 1, ... (ids name both)."""
    rng = np.random.default_rng([seed, 3])
    system_and_tools = tokens.draw(rng, config.system_len)
    histories = [
        system_and_tools + tokens.draw(rng, config.user_len) for _ in range(config.num_sessions)
    ]
    requests = []
    for turn in range(config.turns_per_session):
        for session in range(config.num_sessions):
            if turn > 0:
                tool_call = tokens.draw(rng, config.call_len)
                tool_result = tokens.draw(rng, config.result_len)
                histories[session] = histories[session] + tool_call + tool_result
            requests.append(
                BenchRequest(
                    f"agent-s{session}-t{turn}",
                    histories[session],
                    config.output_len,
                    "agent",
                    group=f"session-{session}",
                )
            )
    return requests
