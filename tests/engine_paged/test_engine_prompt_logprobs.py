"""Prompt log probabilities, recomputed from the prompt: equal to transformers' log-softmax at
every position, the same whether or not the prompt is cached, the cache left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams

PROMPT = [(13 * i) % 300 + 5 for i in range(70)]


def test_prompt_logprobs_equal_transformers(tiny_qwen2_dir: Path) -> None:
    llm = LLM(str(tiny_qwen2_dir), dtype="float32", num_blocks=64, block_size=4)
    entries = llm.prompt_logprobs(PROMPT, top=3)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir, dtype=torch.float32)
    with torch.inference_mode():
        expected = torch.log_softmax(hf(torch.tensor([PROMPT])).logits[0].float(), dim=-1)
    assert entries[0] is None and len(entries) == len(PROMPT)
    for position, entry in enumerate(entries[1:], start=1):
        row = expected[position - 1]  # predicts token `position`
        assert entry is not None and entry.token_id == PROMPT[position]
        assert entry.logprob == pytest.approx(float(row[PROMPT[position]]), abs=1e-4)
        assert entry.rank == int((row > row[PROMPT[position]]).sum()) + 1
        assert [t for t, _ in entry.top] == torch.topk(row, 3).indices.tolist()
        assert entry.top[0][1] >= entry.top[1][1] >= entry.top[2][1]


def test_cached_prompt_gives_the_same_and_cache_is_untouched(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4)
    cold = llm.prompt_logprobs(PROMPT, top=0)
    llm.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0.0))  # now cached
    assert llm.cache.lookup(PROMPT) >= 64
    stats = llm.stats()
    assert llm.prompt_logprobs(PROMPT, top=0) == cold
    assert llm.stats()["hit_tokens"] == stats["hit_tokens"]  # not read from the cache
    llm.cache.check_invariants()
    assert all(e is None or e.top == () for e in cold)


def test_bad_top_and_prompts(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4)
    for top in (-1, 21, True, 1.5):
        with pytest.raises(ValueError, match="top"):
            llm.prompt_logprobs(PROMPT, top=top)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        llm.prompt_logprobs([10**9])
    assert llm.prompt_logprobs([7]) == [None]
