"""No request stops the engine: a step that raises fails the request that caused it, alone.

Faults are injected into the model forward (before it runs, or after it wrote garbage into
the step's blocks) and into the sampler; the other requests of the step must end exactly as
they do without the fault, no block may leak, and nothing the failed step wrote may be cached.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from prefixcache.engine.llm import LLM
from prefixcache.engine.outputs import INTERNAL_ERROR
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.scheduler_output import SchedulerOutput

POISON = 250  # a prompt starting with this token makes the injected fault fire
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
CLEAN = [[(5 * i + j) % 200 + 1 for i in range(21)] for j in range(3)]
POISONED = [POISON] + [(3 * i) % 200 + 1 for i in range(25)]


def poisoned(out: SchedulerOutput, min_output_tokens: int) -> bool:
    return any(
        seq.request.tokens[0] == POISON and seq.request.num_output_tokens >= min_output_tokens
        for seq in out.sequences
    )


def inject_forward_fault(llm: LLM, min_output_tokens: int = 0, garbage: bool = False) -> None:
    """Make a step raise while it holds the poisoned request (once it has generated
    ``min_output_tokens``); with ``garbage``, the step first writes nonsense into every block
    it was writing to, as a forward that failed half way could."""
    runner = llm.engine.runner
    forward: Callable[[SchedulerOutput], object] = runner._sampled_hidden

    def faulty(out: SchedulerOutput):
        if not poisoned(out, min_output_tokens):
            return forward(out)
        if garbage:
            forward(out)
            for seq in out.sequences:
                request = seq.request
                uncommitted = request.block_ids[request.num_committed_blocks:]
                for k, v in zip(llm.kv.k, llm.kv.v, strict=True):
                    k[uncommitted] = 1e4
                    v[uncommitted] = -1e4
        raise RuntimeError("injected forward fault")

    runner._sampled_hidden = faulty


def assert_idle_and_consistent(llm: LLM) -> None:
    llm.cache.check_invariants()
    llm.engine.scheduler.check_invariants()
    stats = llm.stats()
    assert stats["in_use"] == 0 and stats["running"] == 0 and stats["waiting"] == 0


def reference_tokens(folder: Path, prompts: list[list[int]],
                     params: SamplingParams = GREEDY) -> list[list[int]]:
    llm = LLM(str(folder), dtype="float32", num_blocks=128, block_size=4,
              enable_prefix_caching=False)
    return [o.token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("min_output_tokens", [0, 3], ids=["prefill", "decode"])
@pytest.mark.parametrize("garbage", [False, True], ids=["raises", "writes-then-raises"])
def test_a_failing_forward_fails_only_its_request(
    tiny_llama_dir: Path, min_output_tokens: int, garbage: bool
) -> None:
    expected = reference_tokens(tiny_llama_dir, [*CLEAN, POISONED])
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=128, block_size=4)
    forward = llm.engine.runner._sampled_hidden
    inject_forward_fault(llm, min_output_tokens, garbage)
    outputs = llm.generate([CLEAN[0], POISONED, CLEAN[1], CLEAN[2]], GREEDY)
    failed = outputs[1]
    assert failed.finished and failed.error_kind == INTERNAL_ERROR
    assert "injected forward fault" in failed.error
    assert [o.token_ids for o in (outputs[0], *outputs[2:])] == expected[:3]
    stats = llm.stats()
    assert stats["request_errors"] == 1 and stats["failed_steps"] == 2  # in the batch, alone
    assert_idle_and_consistent(llm)
    # Nothing the failed steps wrote was cached: with the fault gone, every prompt (the
    # poisoned one hitting its own committed prefix) gets the uncached answer.
    llm.engine.runner._sampled_hidden = forward
    again = llm.generate([CLEAN[0], POISONED, CLEAN[1], CLEAN[2]], GREEDY)
    assert [o.token_ids for o in again] == [expected[0], expected[3], *expected[1:3]]
    assert llm.stats()["hit_tokens"] > 0
    assert_idle_and_consistent(llm)


def test_a_request_failing_alone_is_failed_at_once(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4)
    inject_forward_fault(llm)
    (failed,) = llm.generate([POISONED], GREEDY)
    assert failed.error_kind == INTERNAL_ERROR
    assert llm.stats()["failed_steps"] == 1
    (served,) = llm.generate([CLEAN[0]], GREEDY)
    assert served.error is None and len(served.token_ids) == GREEDY.max_tokens
    assert_idle_and_consistent(llm)


def test_n_samples_fail_together_and_the_rest_goes_on(tiny_llama_dir: Path) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.8, seed=3, n=3, ignore_eos=True)
    reference = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=128, block_size=4)
    expected = [[o.token_ids for o in out.outputs] for out in reference.generate(CLEAN[:2], params)]
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=128, block_size=4)
    inject_forward_fault(llm, min_output_tokens=2)
    outputs = llm.generate([CLEAN[0], POISONED, CLEAN[1]], params)
    assert outputs[1].error_kind == INTERNAL_ERROR
    assert all(o.finish_reason == "abort" for o in outputs[1].outputs)
    # the others' seeded samples, retried alone after the batch failed, draw as before
    assert [[o.token_ids for o in out.outputs] for out in (outputs[0], outputs[2])] == expected
    assert_idle_and_consistent(llm)


def test_a_sampling_failure_fails_its_request_only(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prefixcache.engine.engine_core as engine_core

    real = engine_core.sample_token

    def faulty(logits, params, generator):
        if params.seed == 666:
            raise FloatingPointError("injected sampling fault")
        return real(logits, params, generator)

    monkeypatch.setattr(engine_core, "sample_token", faulty)
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=128, block_size=4)
    sampled = SamplingParams(max_tokens=5, temperature=1.0, seed=1, ignore_eos=True)
    bad = SamplingParams(max_tokens=5, temperature=1.0, seed=666, ignore_eos=True)
    llm.engine.add_request("good", CLEAN[0], sampled)
    llm.engine.add_request("bad", CLEAN[1], bad)
    llm.engine.add_request("greedy", CLEAN[2], GREEDY)
    finished = {}
    while llm.engine.has_unfinished():
        for output in llm.engine.step(finished_only=True):
            finished[output.request_id] = output
    assert finished["bad"].error_kind == INTERNAL_ERROR
    assert "injected sampling fault" in finished["bad"].error
    assert len(finished["good"].token_ids) == 5 and finished["good"].error is None
    assert finished["greedy"].token_ids == reference_tokens(tiny_llama_dir, [CLEAN[2]])[0]
    assert llm.stats()["request_errors"] == 1
    assert_idle_and_consistent(llm)
