"""prefix-repetition: a few long prefixes reused by many prompts, each with its own suffix."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixcache.integrations.bench.bench_request import BenchRequest
from prefixcache.integrations.bench.token_source import TokenRange, check_positive


@dataclass(frozen=True)
class PrefixRepetitionConfig:
    """``num_prompts`` prompts of prefix_len + suffix_len tokens; prefix i serves prompts
    i, i + num_prefixes, ... before a seeded shuffle."""

    num_prompts: int = 12
    num_prefixes: int = 3
    prefix_len: int = 384
    suffix_len: int = 32
    output_len: int = 8

    def __post_init__(self) -> None:
        check_positive(**self.__dict__)


def build_prefix_repetition(
    config: PrefixRepetitionConfig, seed: int, tokens: TokenRange
) -> list[BenchRequest]:
    rng = np.random.default_rng([seed, 4])
    prefixes = [tokens.draw(rng, config.prefix_len) for _ in range(config.num_prefixes)]
    owners = rng.permutation([i % config.num_prefixes for i in range(config.num_prompts)])
    return [
        BenchRequest(
            f"prefix-repetition-{index}",
            prefixes[int(owner)] + tokens.draw(rng, config.suffix_len),
            config.output_len,
            "prefix-repetition",
            group=f"prefix-{int(owner)}",
        )
        for index, owner in enumerate(owners)
    ]
