"""Logit bias, min_tokens and the repetition / frequency / presence penalties, against a
reference written token by token, and through the engine against a decode loop that applies
the reference to each step's logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from step_logits import record_step_logits

from prefixcache.engine.llm import LLM
from prefixcache.engine.logits_processors import process_logits
from prefixcache.engine.request import Request
from prefixcache.engine.sampling_params import SamplingParams

EOS = 0  # the tiny model's end of sequence
VOCAB = 384
PROMPT = [(7 * i) % 300 + 1 for i in range(14)]


def reference(logits: list[float], params: SamplingParams, prompt: list[int],
              output: list[int], eos: list[int]) -> list[float]:
    """One row processed the way OpenAI and vLLM describe it, a token at a time."""
    logits = list(logits)
    for token, bias in params.logit_bias.items():
        if token < len(logits):  # a bias past the vocabulary biases nothing
            logits[token] += bias
    if len(output) < params.min_tokens:
        for token in {*params.stop_token_ids, *([] if params.ignore_eos else eos)}:
            logits[token] = float("-inf")
    for token in range(len(logits)):
        if token in prompt or token in output:
            rp = params.repetition_penalty
            logits[token] = logits[token] / rp if logits[token] > 0 else logits[token] * rp
        occurrences = output.count(token)
        logits[token] -= params.frequency_penalty * occurrences
        logits[token] -= params.presence_penalty * (occurrences > 0)
    return logits


def request_with(params: SamplingParams, prompt: list[int], output: list[int]) -> Request:
    request = Request("r", prompt, params)
    for token in output:
        request.append_token(token)
    return request


PARAMS = [
    SamplingParams(max_tokens=20, logit_bias={3: 5.0, 7: -100.0, 3000: 1.0}),
    SamplingParams(max_tokens=20, min_tokens=6, stop_token_ids=[9]),
    SamplingParams(max_tokens=20, min_tokens=6, ignore_eos=True),
    SamplingParams(max_tokens=20, repetition_penalty=1.7),
    SamplingParams(max_tokens=20, repetition_penalty=0.6, frequency_penalty=0.5),
    SamplingParams(max_tokens=20, frequency_penalty=-1.2, presence_penalty=2.0),
    SamplingParams(max_tokens=20),  # nothing: a row left as it is
]


def test_batched_processing_equals_the_reference_row_by_row() -> None:
    generator = np.random.default_rng(0)
    vocab = 40
    logits = torch.from_numpy(generator.normal(0, 3, (len(PARAMS), vocab)).astype(np.float32))
    rows = []
    for params in PARAMS:
        prompt = generator.integers(0, vocab, 12).tolist()
        output = generator.integers(0, vocab, 4).tolist()
        rows.append((params, prompt, output))
    expected = [reference(logits[i].tolist(), p, prompt, output, [EOS])
                for i, (p, prompt, output) in enumerate(rows)]
    processed = logits.clone()
    process_logits(processed, [request_with(p, prompt, out) for p, prompt, out in rows], [EOS])
    torch.testing.assert_close(processed, torch.tensor(expected), rtol=1e-6, atol=1e-5)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir: Path) -> LLM:
    return LLM(str(tiny_llama_dir), dtype="float32", num_blocks=128, block_size=4)


def test_a_large_logit_bias_forces_its_token(llm: LLM) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logit_bias={42: 100})
    assert llm.generate([PROMPT], params)[0].token_ids == [42] * 6


def test_min_tokens_holds_back_eos_until_then(llm: LLM) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.0, logit_bias={EOS: 100}, min_tokens=5)
    (output,) = llm.generate([PROMPT], params)
    assert len(output.token_ids) == 6 and EOS not in output.token_ids[:5]
    assert output.token_ids[5] == EOS and output.finish_reason == "stop"


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, frequency_penalty=1.5),
    SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, repetition_penalty=1.8,
                   presence_penalty=0.7),
], ids=["frequency", "repetition+presence"])
def test_greedy_with_penalties_equals_a_loop_over_reference_steps(
    tiny_llama_dir: Path, llm: LLM, params: SamplingParams
) -> None:
    """The engine's greedy tokens are the argmax of the reference-processed logits of each
    step, the logits coming from a plain engine fed the growing sequence."""
    plain = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=128, block_size=4,
                enable_prefix_caching=False)
    recorded = record_step_logits(plain)
    output: list[int] = []
    for _ in range(params.max_tokens):
        plain.generate([PROMPT + output], SamplingParams(max_tokens=1, temperature=0.0))
        row = reference(recorded[-1][0].tolist(), params, PROMPT, output, [EOS])
        output.append(int(torch.tensor(row).argmax()))
    assert llm.generate([PROMPT], params)[0].token_ids == output
    llm.cache.check_invariants()


def test_sampled_forks_with_processors_run_to_their_length(llm: LLM) -> None:
    params = SamplingParams(max_tokens=8, temperature=0.9, seed=5, n=3, ignore_eos=True,
                            logit_bias={11: 3.0}, frequency_penalty=0.4, min_p=0.05,
                            repetition_penalty=1.2)
    (output,) = llm.generate([PROMPT], params)
    assert [len(o.token_ids) for o in output.outputs] == [8, 8, 8]
    again = llm.generate([PROMPT], params)[0]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in output.outputs]
    assert llm.stats()["in_use"] == 0
