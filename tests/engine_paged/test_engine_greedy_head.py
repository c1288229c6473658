"""Greedy steps take the output head's int8 screen (``CausalLM.greedy_tokens``): the tokens are
those of the full logits, on the real model (prefills over cached prefixes, decode batches)
and on a tiny one whose head is replaced after loading."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prefixcache.engine.llm import LLM
from prefixcache.engine.model.packed_linear import PackedLinear
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.kernels.dispatch import cpu_kernels

if not cpu_kernels().greedy_screen_available():
    pytest.skip("the greedy screen needs the compiled kernels and AVX512-VNNI",
                allow_module_level=True)  # fmt: skip

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
SYSTEM = "You are a terse assistant who answers questions about data structures. " * 4
QUESTIONS = ["What is a radix tree?", "Why hash token blocks?", "What does copy-on-write save?"]


def run_workload(llm: LLM) -> list[list[int]]:
    """One question alone, then all of them at once (prefix hits, a decode batch of three), then
    a greedy request beside a sampled one (whose steps hand out logits)."""
    prompts = [SYSTEM + question for question in QUESTIONS]
    outs = llm.generate(prompts[:1], GREEDY) + llm.generate(prompts, GREEDY)
    sampled = SamplingParams(max_tokens=12, temperature=0.9, seed=1, ignore_eos=True)
    engine = llm.engine
    engine.add_request("sampled", llm.encode(prompts[2]), sampled)
    engine.add_request("greedy", llm.encode(prompts[1]), GREEDY)
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    llm.cache.check_invariants()
    assert llm.stats()["in_use"] == 0
    return [o.token_ids for o in outs] + [finished["greedy"].token_ids]


def test_smollm2_greedy_tokens_equal_the_full_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = []
    results: list[torch.Tensor | None] = []
    screened_argmax = cpu_kernels().screened_argmax

    def spy(*args, **kwargs):
        results.append(screened_argmax(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(cpu_kernels(), "screened_argmax", spy)
    answers.append(run_workload(LLM("smollm2", num_blocks=256)))
    assert len(results) == 2 * 12  # every step of the two all-greedy runs, prefill and decode
    assert sum(r is not None for r in results) >= 20  # it decided (None: the full head ran)
    monkeypatch.setenv("PREFIXCACHE_GREEDY_SCREEN", "0")
    results.clear()
    plain = LLM("smollm2", num_blocks=256)
    assert plain.engine.runner.model.greedy_screen is None
    answers.append(run_workload(plain))
    assert not results
    assert answers[0] == answers[1]


def test_a_replaced_head_is_not_screened_with_the_old_copy(tiny_llama_hd64_dir: Path) -> None:
    llm = LLM(str(tiny_llama_hd64_dir), dtype="bfloat16", num_blocks=32)
    model = llm.engine.runner.model
    assert model.greedy_screen is not None
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, model.config.hidden_size, generator=generator).to(torch.bfloat16)
    assert torch.equal(model.greedy_tokens(hidden), model.compute_logits(hidden).argmax(-1))
    weight = torch.randn(model.config.vocab_size, model.config.hidden_size, generator=generator)
    model.lm_head = PackedLinear(weight.to(torch.bfloat16), None)
    expected = model.compute_logits(hidden).argmax(-1)
    assert torch.equal(model.greedy_tokens(hidden), expected)
