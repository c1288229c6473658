"""Recording the logits of every step an engine runs."""

from __future__ import annotations

import torch

from prefixcache.engine.llm import LLM


def record_step_logits(llm: LLM) -> list[torch.Tensor]:
    """From now on, every step of ``llm`` computes full logits (an all-greedy step too, its
    tokens their argmax, instead of the runner's greedy path) and appends them, each
    ``[num_sampled, vocab]`` float32, to the returned list."""
    runner = llm.engine.runner
    recorded: list[torch.Tensor] = []
    execute = runner.execute

    def logits_of(out) -> torch.Tensor:
        recorded.append(execute(out))
        return recorded[-1]

    runner.execute = logits_of
    runner.execute_greedy = lambda out: logits_of(out).argmax(dim=-1).tolist()
    return recorded
