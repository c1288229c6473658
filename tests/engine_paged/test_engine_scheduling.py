"""Scheduler behaviour: token budget, cache-aware admission order, unschedulable requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prefixcache import PrefixCache
from prefixcache.engine.llm import LLM
from prefixcache.engine.request import Request
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.engine.scheduler import Scheduler
from prefixcache.engine.scheduling_policy import SchedulingPolicy

PARAMS = SamplingParams(max_tokens=4, temperature=0.0)


def make_request(name: str, tokens: list[int]) -> Request:
    return Request(name, tokens, PARAMS)


def test_token_budget_chunks_prefill_and_decodes_first() -> None:
    cache = PrefixCache(num_blocks=64, block_size=4)
    scheduler = Scheduler(cache, max_num_seqs=8, max_num_batched_tokens=10)
    scheduler.add(make_request("a", list(range(1, 26))))  # 25 tokens: 3 chunks of <= 10
    chunks = []
    while scheduler.waiting or any(r.num_computed_tokens < r.num_tokens for r in scheduler.running):
        out = scheduler.schedule()
        chunks.append(out.num_tokens)
        assert out.num_tokens <= 10
        scheduler.commit_step(out)
    assert chunks == [10, 10, 5]
    request = scheduler.running[0]
    assert len(request.block_ids) == 7 and cache.stats()["cached_blocks_total"] == 6
    scheduler.finish(request, "stop")
    assert cache.stats()["in_use"] == 0
    cache.check_invariants()


def test_cache_aware_order_prefers_long_hits_but_bounds_waiting() -> None:
    cache = PrefixCache(num_blocks=64, block_size=4)
    hot = list(range(1, 17))
    blocks = cache.allocate(4)
    cache.insert(hot, blocks)
    cache.release(blocks)
    cold = make_request("cold", [99] * 16)
    warm = make_request("warm", [*hot, 5])
    policy = SchedulingPolicy("cache-aware", max_wait_steps=3)
    first = policy.order([cold, warm], cache, step=1)
    assert [r.request_id for r in first] == ["warm", "cold"]  # the longer cached prefix first
    # after max_wait_steps the overdue request goes first whatever its hit length
    assert [r.request_id for r in policy.order([cold, warm], cache, step=4)] == ["cold", "warm"]


def test_fcfs_keeps_arrival_order() -> None:
    cache = PrefixCache(num_blocks=8, block_size=4)
    requests = [make_request(str(i), [i + 1] * 5) for i in range(3)]
    assert SchedulingPolicy("fcfs").order(requests, cache, 1) == requests


def test_pinned_blocks_make_a_request_unschedulable(tiny_llama_dir: Path) -> None:
    """A request that cannot fit even alone (pins hold the pool) fails with a clear error and
    the engine keeps serving."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=12, block_size=4)
    pinned = list(range(1, 33))  # 8 blocks
    assert llm.warm(pinned, pin=True) == 32
    engine = llm.engine
    engine.add_request("too-big", [200] * 30, SamplingParams(max_tokens=8))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert outputs[-1].finished and "KV blocks" in (outputs[-1].error or "")
    llm.cache.unpin(pinned)
    assert llm.generate([[200] * 30], SamplingParams(max_tokens=8))[0].finished
    assert llm.stats()["in_use"] == 0
    llm.cache.check_invariants()


def test_a_request_pins_leave_no_room_for_is_refused_up_front(tiny_llama_dir: Path) -> None:
    """Pins hold 8 of 12 blocks: a request needing 5 is refused before it runs, unless the
    pinned prefix is its own (shared, so it fits)."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=12, block_size=4)
    pinned = list(range(1, 33))  # 8 blocks
    assert llm.warm(pinned, pin=True) == 32
    with pytest.raises(ValueError, match="pins hold 8 of the pool's 12"):
        llm.generate([[200] * 3], SamplingParams(max_tokens=17))
    own = llm.generate([[*pinned, 7, 7, 7]], SamplingParams(max_tokens=9, ignore_eos=True))[0]
    assert own.finished and own.num_cached_tokens == 32
    llm.cache.unpin(pinned)
    assert llm.generate([[200] * 3], SamplingParams(max_tokens=17))[0].finished
    assert llm.stats()["in_use"] == 0
    llm.cache.check_invariants()


def test_a_partial_hit_that_fills_the_pool_is_given_up(tiny_llama_dir: Path) -> None:
    """A pool of 2 blocks: the second run of a 20-token prompt matches the first run's
    partial block, whose reference leaves no block to copy it into. The request drops the
    partial hit and computes those tokens, answering what the first run did."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=2, block_size=16)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompt = list(range(1, 21))  # 20 tokens + 8 new: 2 blocks
    first = llm.generate([prompt], params)[0]
    second = llm.generate([prompt], params)[0]
    assert second.error is None and second.outputs[0].token_ids == first.outputs[0].token_ids
    assert second.num_cached_tokens == 16
    assert llm.stats()["in_use"] == 0
    llm.cache.check_invariants()


@pytest.mark.parametrize("policy", ["fcfs", "cache-aware"])
def test_the_request_that_cannot_fit_is_the_one_failed(tiny_llama_dir: Path, policy: str) -> None:
    """Pins taken after admission leave room for A (4 tokens) but not for B (the pinned
    prefix + 12): whichever the policy tries first, B alone fails and A is answered (the
    cache-aware order tried B, and the oldest request, A, was failed in its place)."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=10, block_size=4,
              scheduling_policy=policy)
    pinned, other = list(range(1, 17)), list(range(101, 117))  # 4 blocks each
    llm.warm(pinned, pin=True)
    llm.warm(other)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    engine = llm.engine
    engine.add_request("A", [201, 202, 203, 204], params)
    engine.add_request("B", [*pinned, *range(301, 313)], params)
    llm.cache.pin(other)  # 2 blocks stay free
    finished = {}
    while engine.has_unfinished():
        finished.update({out.request_id: out for out in engine.step() if out.finished})
    assert finished["A"].error is None and len(finished["A"].token_ids) == 2
    assert "KV blocks" in (finished["B"].error or "")
    assert llm.stats()["in_use"] == 0
    llm.cache.check_invariants()


def test_the_hit_rate_counts_each_request_once(tiny_llama_dir: Path) -> None:
    """Requests that wait for blocks (and are preempted and resumed) count their prompt and
    hit once, at their first admission: the counters were bumped at every failed attempt."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=24, block_size=4)
    prefix = list(range(1, 17))
    llm.warm(prefix)
    before = llm.stats()
    prompts = [[*prefix, *range(100 + 10 * i, 108 + 10 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params)
    after = llm.stats()
    assert after["query_tokens"] - before["query_tokens"] == sum(map(len, prompts))
    assert after["hit_tokens"] - before["hit_tokens"] == sum(o.num_cached_tokens for o in outs)
    assert llm.stats()["in_use"] == 0


def test_forked_samples_stay_within_max_num_seqs(tiny_llama_dir: Path) -> None:
    """Two n = 4 requests under max_num_seqs = 2: no step runs more than 2 sequences (forks
    went straight into the running set: 8 ran), every sample completes, and greedy samples
    still equal the n = 1 answer."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4,
              max_num_seqs=2, max_num_batched_tokens=8)
    engine, scheduler = llm.engine, llm.engine.scheduler
    prompts = {"a": list(range(1, 11)), "b": list(range(20, 30))}
    greedy = SamplingParams(n=4, max_tokens=5, temperature=0.0, ignore_eos=True)
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, greedy)
    finished, most = {}, 0
    while engine.has_unfinished():
        finished.update({out.request_id: out for out in engine.step() if out.finished})
        most = max(most, len(scheduler.running))
    assert most <= 2
    single = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    for request_id, prompt in prompts.items():
        expected = llm.generate([prompt], single)[0].token_ids
        assert [o.token_ids for o in finished[request_id].outputs] == [expected] * 4
    assert llm.stats()["in_use"] == 0
    llm.cache.check_invariants()


def test_unschedulable_forked_request_fails_every_sample(tiny_llama_dir: Path) -> None:
    """n > 1 samples that outgrow a pool held by pins: when one cannot be resumed, the
    request fails as a whole (its other samples too) and the engine keeps serving."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=12, block_size=4)
    pinned = list(range(1, 33))  # 8 blocks of 12
    assert llm.warm(pinned, pin=True) == 32
    engine = llm.engine
    params = SamplingParams(max_tokens=17, n=2, temperature=1.0, seed=1, ignore_eos=True)
    engine.add_request("forked", [200] * 3, params)  # a sample outgrows the 4 free blocks
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert outputs[-1].finished and "KV blocks" in (outputs[-1].error or "")
    assert llm.stats()["in_use"] == 0
    llm.cache.check_invariants()
    assert llm.generate([[200] * 5], SamplingParams(max_tokens=4))[0].finished
    assert llm.stats()["in_use"] == 0


def test_request_tokens_buffer_grows_with_outputs() -> None:
    request = make_request("r", [1, 2, 3])
    request.append_token(7)
    assert request.output_token_ids == [7] and list(request.all_tokens) == [1, 2, 3, 7]
    assert request.all_tokens.dtype == np.int32


def test_finished_only_steps_hand_out_just_the_finished_requests(tiny_llama_dir: Path) -> None:
    """``step(finished_only=True)`` (what ``generate`` runs) skips the running requests'
    snapshots; the finished ones come out exactly as plain steps make them."""
    prompts = {"short": [5, 6, 7], "long": [8, 9, 10, 11]}
    lengths = {"short": 2, "long": 5}
    results = {}
    for finished_only in (False, True):
        llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=32, block_size=4)
        engine = llm.engine
        for name, prompt in prompts.items():
            params = SamplingParams(max_tokens=lengths[name], temperature=0.0, ignore_eos=True)
            engine.add_request(name, prompt, params)
        steps = []
        while engine.has_unfinished():
            steps.append(engine.step(finished_only=finished_only))
        if finished_only:
            assert all(out.finished for outs in steps for out in outs)
        else:
            assert any(not out.finished for outs in steps for out in outs)
        results[finished_only] = {
            out.request_id: (out.outputs[0].token_ids, out.text)
            for outs in steps
            for out in outs
            if out.finished
        }
        assert llm.stats()["in_use"] == 0
        llm.cache.check_invariants()
    assert results[True] == results[False] and set(results[True]) == set(prompts)
