"""shared-prefix: groups of prompts that share a system prompt, each with its own question."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixcache.integrations.bench.bench_request import BenchRequest
from prefixcache.integrations.bench.token_source import TokenRange, check_positive


@dataclass(frozen=True)
class SharedPrefixConfig:
    """``num_groups`` system prompts of ``system_len`` tokens, ``prompts_per_group`` questions
    of ``question_len`` tokens each; every prompt is exactly system_len + question_len."""

    num_groups: int = 3
    prompts_per_group: int = 3
    system_len: int = 384
    question_len: int = 32
    output_len: int = 8

    def __post_init__(self) -> None:
        check_positive(**self.__dict__)


def build_shared_prefix(
    config: SharedPrefixConfig, seed: int, tokens: TokenRange
) -> list[BenchRequest]:
    """Prompts in a seeded shuffled order (the first of each group is the cold one)."""
    rng = np.random.default_rng([seed, 1])
    system_prompts = [tokens.draw(rng, config.system_len) for _ in range(config.num_groups)]
    requests = [
        BenchRequest(
            request_id="",
            prompt_token_ids=system_prompts[group] + tokens.draw(rng, config.question_len),
            max_tokens=config.output_len,
            workload="shared-prefix",
            group=f"system-{group}",
        )
        for group in range(config.num_groups)
        for _ in range(config.prompts_per_group)
    ]
    order = rng.permutation(len(requests))
    return [
        _with_id(requests[int(position)], f"shared-prefix-{index}")
        for index, position in enumerate(order)
    ]


def _with_id(request: BenchRequest, request_id: str) -> BenchRequest:
    return BenchRequest(
        request_id, request.prompt_token_ids, request.max_tokens, request.workload, request.group
    )
