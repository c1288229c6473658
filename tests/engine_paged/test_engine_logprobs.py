"""Log probabilities: each sampled token's is the model's raw log-softmax at that step, the top
list is sorted (ties by lower id), greedy tokens head their own list, and every sample of
every request carries one entry per token, through forks and preemption."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from step_logits import record_step_logits

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]


def engine(folder: Path, num_blocks: int = 64) -> LLM:
    return LLM(str(folder), dtype="float32", num_blocks=num_blocks, block_size=4)


def test_greedy_logprobs_are_the_steps_log_softmax(tiny_llama_dir: Path) -> None:
    llm = engine(tiny_llama_dir)
    recorded = record_step_logits(llm)
    out = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=6, temperature=0.0, logprobs=3,
                                                    ignore_eos=True))[0].outputs[0]  # fmt: skip
    assert len(out.logprobs) == len(out.token_ids) == len(recorded) == 6
    for entry, token, logits in zip(out.logprobs, out.token_ids, recorded, strict=True):
        expected = torch.log_softmax(logits[0].float(), dim=-1)
        assert entry.token_id == token and entry.logprob == float(expected[token])
        assert entry.top[0] == (token, entry.logprob)  # greedy: its own top
        values = [value for _, value in entry.top]
        assert values == sorted(values, reverse=True) and len(entry.top) == 3
        assert all(v <= 0.0 for v in values)


def test_logprobs_zero_reports_the_sampled_token_alone(tiny_llama_dir: Path) -> None:
    llm = engine(tiny_llama_dir)
    plain = llm.generate(PROMPTS, SamplingParams(max_tokens=4, temperature=0.0))
    asked = llm.generate(PROMPTS, SamplingParams(max_tokens=4, temperature=0.0, logprobs=0))
    for a, b in zip(plain, asked, strict=True):
        assert a.outputs[0].logprobs is None
        assert b.outputs[0].token_ids == a.outputs[0].token_ids  # the same tokens
        assert all(e.top == () and e.logprob <= 0.0 for e in b.outputs[0].logprobs)


def test_every_sample_has_its_own_entries_through_preemption(tiny_llama_dir: Path) -> None:
    llm = engine(tiny_llama_dir, num_blocks=14)  # too small for all of them at once
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=4, n=3, logprobs=2,
                            ignore_eos=True)  # fmt: skip
    outs = llm.generate([[5 + k, 6, 7, 8, 9] for k in range(3)], params)
    assert llm.stats()["preemptions"] > 0
    for out in outs:
        for sample in out.outputs:
            assert [e.token_id for e in sample.logprobs] == sample.token_ids
            assert all(math.isfinite(e.logprob) for e in sample.logprobs)
    llm.cache.check_invariants()


def test_a_bad_logprobs_count_is_refused() -> None:
    for value, error in [(-1, ValueError), (21, ValueError), (1.5, TypeError), (True, TypeError)]:
        with pytest.raises(error, match="logprobs"):
            SamplingParams(logprobs=value)
