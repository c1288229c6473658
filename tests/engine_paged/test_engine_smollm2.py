"""The real default model: cached answers equal uncached ones, and the prefix is reused."""

from __future__ import annotations

import pytest
import torch

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def smollm2() -> LLM:
    return LLM("smollm2", num_blocks=256)


def test_chat_cached_equals_uncached(smollm2: LLM) -> None:
    system = {"role": "system", "content": "You answer in one short sentence. " * 6}
    conversations = [
        [system, {"role": "user", "content": "What colour is the sky?"}],
        [system, {"role": "user", "content": "What is two plus two?"}],
    ]
    first = [smollm2.chat(c, GREEDY)[0] for c in conversations]
    again = [smollm2.chat(c, GREEDY)[0] for c in conversations]
    assert first[1].num_cached_tokens > 0  # the system prompt was reused across questions
    assert all(o.num_cached_tokens > 0 for o in again)
    assert [o.token_ids for o in again] == [o.token_ids for o in first]
    assert first[0].text.strip()
    stats = smollm2.stats()
    assert stats["in_use"] == 0 and stats["hit_tokens"] > 0
    smollm2.cache.check_invariants()


def test_cached_prefill_equals_full_prefill_logits(smollm2: LLM) -> None:
    """Greedy continuation of a long prompt is the same whether its prefix came from the cache
    (prefill over a paged context) or was computed in one go."""
    prompt = smollm2.encode("The printing press changed how knowledge spread across Europe. " * 8)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    scheduler = smollm2.engine.scheduler
    scheduler.enable_prefix_caching = False  # the same engine, computing everything
    try:
        cold = smollm2.generate([prompt], params)
    finally:
        scheduler.enable_prefix_caching = True
    smollm2.warm(prompt[:-5])
    warm = smollm2.generate([prompt], params)[0]
    assert warm.num_cached_tokens >= (len(prompt) - 5) // 16 * 16
    assert warm.token_ids == cold[0].token_ids


def test_a_partial_block_hit_before_a_long_chunk_equals_uncached(smollm2: LLM) -> None:
    """A hit that ends inside a block (an odd number of tokens into it), then 33 new tokens:
    the first token's logits are bitwise the uncached ones. The compiled attention once let a
    row's tile neighbours move its softmax rounding: 0.4-0.75 apart in a logit here."""
    from step_logits import record_step_logits

    recorded = record_step_logits(smollm2)
    first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    base = [(37 * i) % 20000 + 100 for i in range(64)]
    prompt = base[:35] + [(53 * i) % 20000 + 200 for i in range(33)]
    scheduler = smollm2.engine.scheduler
    smollm2.cache.reset()
    scheduler.enable_prefix_caching = False
    try:
        smollm2.generate([prompt], first)
    finally:
        scheduler.enable_prefix_caching = True
    cold = recorded[-1]
    smollm2.generate([base], first)
    warm = smollm2.generate([prompt], first)[0]
    assert warm.num_cached_tokens == 35  # two full blocks and 3 tokens of the third
    assert torch.equal(recorded[-1], cold)
