"""A cached answer equals an uncached one: every cache path against the no-reuse path."""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_calls import CPU_ATTENTION_NAMES, CPU_MODEL_OP_NAMES, record_cpu_kernel_calls

from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.kernels.dispatch import cpu_kernels

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def shared_prefix_prompts() -> list[list[int]]:
    """Prompts sharing a 37-token system prefix (not a block multiple), plus repeats."""
    system = [(7 * i) % 300 + 1 for i in range(37)]
    questions = [[11, 12, 13], [11, 12, 14, 15, 16], list(range(40, 61)), [99]]
    prompts = [system + q for q in questions]
    return prompts + prompts[:2] + [system[:20]]


def run_engine(folder: Path, prompts: list[list[int]], **kwargs) -> tuple[list[list[int]], LLM]:
    llm = LLM(str(folder), **{"dtype": "float32", **kwargs})
    tokens = []
    for prompt in prompts:  # one at a time, so later prompts hit what earlier ones cached
        tokens.append(llm.generate([prompt], GREEDY)[0].token_ids)
    return tokens, llm


def assert_idle_and_consistent(llm: LLM) -> None:
    llm.cache.check_invariants()
    stats = llm.stats()
    assert stats["in_use"] == 0 and stats["running"] == 0 and stats["waiting"] == 0


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("chunk", [5, 64])
def test_cached_equals_uncached(tiny_llama_dir: Path, block_size: int, chunk: int) -> None:
    prompts = shared_prefix_prompts()
    expected, _ = run_engine(
        tiny_llama_dir, prompts, enable_prefix_caching=False, num_blocks=64, block_size=block_size
    )
    got, llm = run_engine(
        tiny_llama_dir, prompts, num_blocks=64, block_size=block_size, max_num_batched_tokens=chunk
    )
    assert got == expected
    stats = llm.stats()
    assert stats["hit_tokens"] >= 4 * (37 // block_size) * block_size  # later prompts hit
    assert_idle_and_consistent(llm)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("chunk", [5, 64])
def test_cached_equals_uncached_bf16_cpu_kernel(
    tiny_llama_hd64_dir: Path, block_size: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 with head_dim 64 runs the compiled CPU kernels where the CPU has them (fused
    decoder layers, attention, elementwise ops, GEMM; the references elsewhere): prefix hits,
    chunked prefill and decode still equal no reuse."""
    calls = record_cpu_kernel_calls(monkeypatch)
    prompts = shared_prefix_prompts()
    kwargs = dict(dtype="bfloat16", num_blocks=64, block_size=block_size)
    expected, _ = run_engine(tiny_llama_hd64_dir, prompts, enable_prefix_caching=False, **kwargs)
    got, llm = run_engine(tiny_llama_hd64_dir, prompts, max_num_batched_tokens=chunk, **kwargs)
    assert got == expected
    assert llm.stats()["hit_tokens"] >= 4 * (37 // block_size) * block_size
    assert_idle_and_consistent(llm)
    if cpu_kernels().cpu_attention_available():
        # every layer and the final norm run in the one fused call (the last layer for the
        # sampled rows only); then the output head
        assert {"decoder_layers_cpu", "linear_cpu"} <= set(calls)
        assert not (set(CPU_ATTENTION_NAMES) | set(CPU_MODEL_OP_NAMES)) & set(calls)


def test_batched_equals_sequential(tiny_qwen2_dir: Path) -> None:
    """Many requests in one batch (decode + chunked prefill mixed) equal one-at-a-time runs."""
    prompts = shared_prefix_prompts()
    expected, _ = run_engine(tiny_qwen2_dir, prompts, enable_prefix_caching=False, num_blocks=64)
    llm = LLM(str(tiny_qwen2_dir), dtype="float32", num_blocks=128, max_num_batched_tokens=24)
    outputs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == expected
    assert_idle_and_consistent(llm)


def test_preemption_by_a_tiny_pool(tiny_llama_dir: Path) -> None:
    """A pool too small for the batch preempts; resumed requests hit their own cached blocks."""
    prompts = [[(3 * i + j) % 250 + 1 for i in range(24)] for j in range(4)]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    reference = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=256, block_size=4)
    expected = [reference.generate([p], params)[0].token_ids for p in prompts]
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=24, block_size=4)
    outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == expected
    assert llm.stats()["preemptions"] > 0
    assert_idle_and_consistent(llm)


def test_n_samples_share_the_prompt_blocks(tiny_llama_dir: Path) -> None:
    """n > 1 forks the prompt's blocks; greedy samples all equal the n = 1 answer, seeded
    samples are reproducible, and no block leaks."""
    prompt = list(range(1, 23))  # 22 tokens: the last block is partial, so writes copy it
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=8)
    single = llm.generate([prompt], GREEDY)[0]
    forked = llm.generate(
        [prompt], SamplingParams(max_tokens=12, temperature=0.0, n=3, ignore_eos=True)
    )[0]
    assert [o.token_ids for o in forked.outputs] == [single.token_ids] * 3
    sampled = SamplingParams(max_tokens=12, temperature=1.0, n=3, seed=7, ignore_eos=True)
    first = llm.generate([prompt], sampled)[0]
    second = llm.generate([prompt], sampled)[0]
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in second.outputs]
    assert len({tuple(o.token_ids) for o in first.outputs}) > 1
    assert_idle_and_consistent(llm)


def test_warm_then_pin_survives_pressure(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=24, block_size=4)
    system = list(range(1, 33))
    assert llm.warm(system, pin=True) == 32
    for j in range(8):  # fill the pool with other prompts
        llm.generate([[200 + j] * 30], SamplingParams(max_tokens=8, temperature=0.0))
    assert llm.cache.lookup(system) == 32
    out = llm.generate([[*system, 5, 6]], GREEDY)[0]
    assert out.num_cached_tokens == 32
    assert_idle_and_consistent(llm)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_partial_block_hits_are_token_exact(tiny_llama_hd64_dir: Path, dtype: str) -> None:
    """A prompt that shares only the first tokens of a cached block copies that block and
    computes from the first differing token: num_cached_tokens is not a block multiple, and
    the answers equal the uncached engine's, alone or admitted together under pressure (a
    copied source may be evicted and reused within the step that copies it)."""
    base = [(5 * i) % 200 + 3 for i in range(8)]  # two blocks of 4
    first = [*base, 21, 22, 23, 24, 25]  # caches a third block [21, 22, 23, 24]
    followers = [[*base, 21, 22, 30 + j, 31, 32] for j in range(3)]  # share 2 of its tokens
    kwargs = dict(dtype=dtype, block_size=4)
    uncached = LLM(str(tiny_llama_hd64_dir), enable_prefix_caching=False, num_blocks=64, **kwargs)
    expected = [uncached.generate([p], GREEDY)[0].token_ids for p in (first, *followers)]

    llm = LLM(str(tiny_llama_hd64_dir), num_blocks=64, **kwargs)
    assert llm.generate([first], GREEDY)[0].token_ids == expected[0]
    out = llm.generate([followers[0]], GREEDY)[0]
    assert out.num_cached_tokens == 10  # 2 full blocks + 2 tokens of the third
    assert out.token_ids == expected[1]
    assert_idle_and_consistent(llm)

    tight = LLM(str(tiny_llama_hd64_dir), num_blocks=12, **kwargs)
    tight.generate([first], GREEDY)
    outputs = tight.generate(followers, GREEDY)
    assert [o.token_ids for o in outputs] == expected[1:]
    assert outputs[0].num_cached_tokens == 10
    assert_idle_and_consistent(tight)


def test_a_finished_request_is_cached_to_its_last_token(tiny_llama_hd64_dir: Path) -> None:
    """warm() caches the whole prompt (its last, partly filled block too), and the next turn
    of a conversation (the previous prompt, its answer, a new message) reuses every token the
    previous request computed; the answers equal the uncached engine's."""
    kwargs = dict(dtype="bfloat16", block_size=4, num_blocks=64)
    system = [(3 * i) % 200 + 5 for i in range(10)]  # 2 full blocks + 2 tokens
    llm = LLM(str(tiny_llama_hd64_dir), **kwargs)
    uncached = LLM(str(tiny_llama_hd64_dir), enable_prefix_caching=False, **kwargs)
    assert llm.warm(system) == 10
    question = [*system, 40, 41, 42]
    first = llm.generate([question], GREEDY)[0]
    assert first.num_cached_tokens == 10
    assert first.token_ids == uncached.generate([question], GREEDY)[0].token_ids
    # the last sampled token was never computed: everything before it is cached
    follow_up = [*question, *first.token_ids, 43, 44]
    second = llm.generate([follow_up], GREEDY)[0]
    assert second.num_cached_tokens == len(question) + len(first.token_ids) - 1
    assert second.token_ids == uncached.generate([follow_up], GREEDY)[0].token_ids
    assert_idle_and_consistent(llm)


def test_seeds_of_forked_samples_wrap_around_torch_range(tiny_llama_dir: Path) -> None:
    """Sample i of n draws from seed + i modulo 2**64: the largest seed's second sample
    draws what seed 0 does, a negative seed what torch makes of it, and nothing overflows."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4)
    prompt = list(range(1, 11))

    def first_tokens(seed: int, n: int) -> list[list[int]]:
        params = SamplingParams(n=n, max_tokens=1, temperature=1.0, seed=seed)
        return [o.token_ids for o in llm.generate([prompt], params)[0].outputs]

    largest = first_tokens(2**64 - 1, n=3)
    assert largest[1:] == [first_tokens(0, n=1)[0], first_tokens(1, n=1)[0]]
    assert first_tokens(-(2**63), n=2) == first_tokens(2**63, n=2)
    assert_idle_and_consistent(llm)


def test_forked_samples_that_end_at_once_share_their_last_block(tiny_llama_dir: Path) -> None:
    """n samples of one token each finish on the prompt's shared, partly filled block: the
    first caches it, the others find it cached already, and nothing leaks."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4)
    prompt = list(range(1, 11))  # 2 full blocks + 2 tokens
    params = SamplingParams(n=3, max_tokens=1, temperature=1.0, seed=1)
    first = llm.generate([prompt], params)[0]
    assert len(first.outputs) == 3
    assert llm.cache.lookup(prompt, partial_block=True) == 10
    again = llm.generate([prompt], params)[0]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in first.outputs]
    assert again.num_cached_tokens == 9  # the last prompt token is always computed
    assert_idle_and_consistent(llm)
