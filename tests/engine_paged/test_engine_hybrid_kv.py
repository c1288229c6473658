"""The hybrid KV cache: sliding-window layers keep their keys in a slot pool much smaller than
the prompts, so the blocks behind each window must be let go while requests run. Its answers
(tokens and their log probabilities, bit for bit) equal the uncached plain engine's (every
layer keeps every block), across chunk and block sizes, preemption, n > 1 and prefix hits whose
early sliding blocks are gone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_model_factory import make_tiny_model_dir

from prefixcache.engine.llm import LLM
from prefixcache.engine.outputs import RequestOutput
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.sliding_slots import SlidingSlots

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
MODELS = {
    "mistral": {"sliding_window": 16},  # every layer slides: no full-layer bytes at all
    "qwen2": {"sliding_window": 24, "use_sliding_window": True, "max_window_layers": 1,
              "num_hidden_layers": 3},
    "gemma3": {"num_hidden_layers": 6, "sliding_window": 16, "query_pre_attn_scalar": 24,
               "tie_word_embeddings": True},  # 5 sliding : 1 global
    "gemma2": {"num_hidden_layers": 4, "sliding_window": 16, "query_pre_attn_scalar": 24,
               "tie_word_embeddings": True, "attn_logit_softcapping": 0.5,
               "final_logit_softcapping": 2.0},
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp(f"hybrid-{request.param}"), request.param,
                               **MODELS[request.param])  # fmt: skip


def prompts() -> list[list[int]]:
    """Several windows long, sharing a 70-token prefix (not a block multiple), plus a repeat."""
    shared = [(7 * i) % 300 + 1 for i in range(70)]
    tails = [[11, 12, 13], list(range(40, 90)), [99]]
    return [shared + tail for tail in tails] + [shared + tails[0]]


def answers(outputs: list[RequestOutput]) -> list:
    """Each request's completions: their tokens and the tokens' log probabilities."""
    return [[(c.token_ids, [entry.logprob for entry in c.logprobs]) for c in o.outputs]
            for o in outputs]  # fmt: skip


def plain(folder: Path, block_size: int, params: SamplingParams = GREEDY,
          batch: list[list[int]] | None = None) -> list:  # fmt: skip
    """The reference: every layer keeps every block, nothing cached."""
    llm = LLM(str(folder), dtype="float32", num_blocks=512, block_size=block_size,
              hybrid_kv_cache=False, enable_prefix_caching=False)  # fmt: skip
    if batch is not None:
        return answers(llm.generate(batch, params))
    return [answers(llm.generate([p], params))[0] for p in prompts()]  # one by one


def small_slot_engine(folder: Path, block_size: int, chunk: int, extra_windows: int = 0,
                      **kwargs) -> LLM:  # fmt: skip
    """A hybrid engine with the fewest slots one request needs (``SlidingSlots.min_slots``:
    the window's slots must be reused as it slides), plus room for ``extra_windows`` more
    windows (what cached prefixes keep)."""
    window = json.loads((folder / "config.json").read_text())["sliding_window"]
    slots = SlidingSlots.min_slots(window, block_size, chunk)
    slots += extra_windows * (-(-window // block_size) + 1)
    llm = LLM(str(folder), dtype="float32", block_size=block_size, max_num_batched_tokens=chunk,
              hybrid_kv_cache=True, kv_sliding_slots=slots, **kwargs)  # fmt: skip
    assert llm.sliding is not None and llm.sliding.window == window
    return llm


@pytest.mark.parametrize("block_size", [4, 16])
def test_hybrid_logits_equal_the_plain_cache_bit_for_bit(model_dir: Path, block_size: int) -> None:
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=0)
    batch = prompts()[:3]

    def run(**kwargs) -> list:
        llm = LLM(str(model_dir), dtype="float32", num_blocks=256, block_size=block_size,
                  max_num_batched_tokens=16, enable_prefix_caching=False, **kwargs)  # fmt: skip
        return [answers(llm.generate([p], params)) for p in batch]

    window = json.loads((model_dir / "config.json").read_text())["sliding_window"]
    fewest = SlidingSlots.min_slots(window, block_size, 16)
    assert run(hybrid_kv_cache=True, kv_sliding_slots=fewest) == run(hybrid_kv_cache=False)


def check_clean(llm: LLM) -> None:
    llm.engine.scheduler.check_invariants()
    llm.cache.check_invariants()
    stats = llm.stats()
    assert stats["in_use"] == 0
    assert stats["sliding_slots_held"] == 0


@pytest.mark.parametrize("extra_windows", [0, 4])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("chunk", [5, 64])
def test_small_slot_pool_answers_equal_the_plain_cache(
    model_dir: Path, block_size: int, chunk: int, extra_windows: int
) -> None:
    expected = plain(model_dir, block_size)
    llm = small_slot_engine(model_dir, block_size, chunk, extra_windows, num_blocks=256)
    got = [answers(llm.generate([p], GREEDY))[0] for p in prompts()]
    assert got == expected
    stats = llm.stats()
    if extra_windows:  # room for the cached prefixes' last windows: the repeats hit
        assert stats["hit_tokens"] >= 2 * (70 // block_size) * block_size
    else:  # slots went from blocks behind the windows
        assert stats["sliding_slots_taken"] > 0
    batched = llm.generate(prompts(), GREEDY)  # mixed decode and chunked prefill, one pool
    assert answers(batched) == expected
    check_clean(llm)


def test_preemption_and_n_above_one(model_dir: Path) -> None:
    sampled = SamplingParams(max_tokens=10, temperature=0.9, seed=7, n=3, ignore_eos=True,
                             logprobs=0)  # fmt: skip
    batch = prompts()
    expected_greedy = plain(model_dir, 4, GREEDY, batch)
    expected_sampled = plain(model_dir, 4, sampled, batch[:2])
    # 40 logical blocks: four 74-120-token requests cannot all run; the slots hold one
    # request's window and step: windows compete for slots too
    llm = small_slot_engine(model_dir, 4, 16, num_blocks=40)
    assert answers(llm.generate(batch, GREEDY)) == expected_greedy
    assert llm.stats()["preemptions"] > 0
    assert answers(llm.generate(batch[:2], sampled)) == expected_sampled
    check_clean(llm)


def test_blocks_behind_the_window_are_let_go_while_decoding(model_dir: Path) -> None:
    llm = small_slot_engine(model_dir, 4, 16, num_blocks=256)
    sliding = llm.sliding
    prompt = prompts()[1]
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    llm._add(np.asarray(prompt, dtype=np.int32), params, None)
    (request,) = llm.engine.scheduler.waiting
    most = -(-(sliding.window - 1) // 4) + 1 + -(-16 // 4)  # window + one step's blocks
    blocks_seen = 0
    while llm.engine.has_unfinished():
        llm.engine.step()
        llm.engine.scheduler.check_invariants()
        held = sliding.held.get(request, [])
        assert len(held) <= most, (len(held), most)
        blocks_seen = max(blocks_seen, len(request.block_ids))
    assert blocks_seen * 4 >= len(prompt) + 59
    assert blocks_seen > 2 * sliding.num_slots  # the request ran on slots lent block by block
    check_clean(llm)


def test_hits_survive_early_sliding_blocks_going(model_dir: Path) -> None:
    prompt = prompts()[1]  # 120 tokens: 30 blocks of 4
    follow_up = [*prompt, 5, 6, 7]
    expected = plain(model_dir, 4, GREEDY, [follow_up])
    llm = small_slot_engine(model_dir, 4, 16, num_blocks=256)
    llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    blocks = llm.cache.match(prompt, None).block_ids
    llm.cache.release(blocks)
    sliding = llm.sliding
    assert (sliding.slot_of[blocks[:5]] < 0).all()  # the early windows' slots were taken
    out = llm.generate([follow_up], GREEDY)
    assert out[0].num_cached_tokens == len(prompt)  # still a whole hit
    assert answers(out) == expected
    check_clean(llm)


def test_a_hit_whose_last_window_lost_its_slots_is_cut_back(model_dir: Path) -> None:
    first = prompts()[1]
    other = [(11 * i) % 300 + 2 for i in range(120)]
    follow_up = [*first, 5, 6, 7]
    expected = plain(model_dir, 4, GREEDY, [follow_up])
    llm = small_slot_engine(model_dir, 4, 16, num_blocks=256)
    llm.generate([first], SamplingParams(max_tokens=1, temperature=0.0))
    llm.generate([other], SamplingParams(max_tokens=1, temperature=0.0))  # takes every slot
    assert llm.cache.lookup(first, None) == len(first)  # the full layers' blocks are cached
    out = llm.generate([follow_up], GREEDY)
    assert out[0].num_cached_tokens < len(first)
    stats = llm.stats()
    assert stats["sliding_shortened_hits"] == 1
    assert stats["sliding_shortened_tokens"] == len(first) - out[0].num_cached_tokens
    assert answers(out) == expected
    check_clean(llm)


def test_memory_goes_to_blocks_the_windows_do_not_need(tmp_path: Path) -> None:
    folder = make_tiny_model_dir(tmp_path, "gemma3", **MODELS["gemma3"])
    budget = 16 << 20
    options = dict(dtype="float32", kv_cache_memory=budget, block_size=16, max_num_seqs=4,
                   max_num_batched_tokens=256)  # fmt: skip
    hybrid = LLM(str(folder), **options)
    every_layer = LLM(str(folder), hybrid_kv_cache=False, **options)
    assert hybrid.kv.nbytes <= budget and every_layer.kv.nbytes <= budget
    assert hybrid.cache.num_blocks > 4 * every_layer.cache.num_blocks  # 1 of 6 layers is full
    # four windows of 16 tokens (and the block each straddles) and one step of 256 tokens
    assert hybrid.stats()["sliding_slots"] == hybrid.kv.k[0].shape[0] == 4 * 3 + 16 + 4
    assert hybrid.kv.k[5].shape[0] == hybrid.cache.num_blocks  # the global layer
    # too little memory for a step's sliding slots: the plain cache, said in the log
    small = LLM(str(folder), dtype="float32", kv_cache_memory=1 << 20, block_size=16)
    assert small.sliding is None and small.cache.num_blocks == (1 << 20) // (6 * 4096)


def test_options_are_checked(tmp_path: Path) -> None:
    llama = make_tiny_model_dir(tmp_path / "llama", "llama")
    with pytest.raises(ValueError, match="sliding-window layers"):
        LLM(str(llama), num_blocks=32, hybrid_kv_cache=True)
    with pytest.raises(TypeError, match="hybrid_kv_cache"):
        LLM(str(llama), num_blocks=32, hybrid_kv_cache="yes")
    with pytest.raises(ValueError, match="KV tiers"):
        LLM(str(llama), num_blocks=32, hybrid_kv_cache=True, kv_host_memory="1MiB")
    with pytest.raises(ValueError, match="kv_sliding_slots"):
        LLM(str(llama), num_blocks=32, kv_sliding_slots=64)
    mistral = make_tiny_model_dir(tmp_path / "mistral", "mistral", sliding_window=16)
    with pytest.raises(ValueError, match="at least"):
        LLM(str(mistral), num_blocks=32, block_size=4, kv_sliding_slots=3)
    tiered = LLM(str(mistral), num_blocks=32, block_size=4, kv_host_memory="1MiB")
    assert tiered.sliding is None  # the tiers keep every layer: no hybrid cache by default
