"""Reading a lower tier ahead of admission: a request whose prefix is on disk waits in the
loading state while the engine keeps stepping the others, and is then served bitwise as the
uncached engine serves it."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefixcache.engine.llm import LLM
from prefixcache.engine.request import RequestStatus
from prefixcache.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
DOC = [(13 * i) % 290 + 3 for i in range(64)]
QUESTION = [7, 8, 9]
OTHER = [(5 * i) % 290 + 3 for i in range(10)]


def engine(folder: Path, disk: Path | None, **kwargs: Any) -> LLM:
    return LLM(str(folder), dtype="float32", num_blocks=64, block_size=4, kv_disk_dir=disk,
               **kwargs)  # fmt: skip


class GatedFetch:
    """Wraps a tier's ``fetch`` so that it blocks until ``gate`` is set."""

    def __init__(self, fetch: Any) -> None:
        self.fetch = fetch
        self.gate = threading.Event()
        self.started = threading.Event()
        self.calls = 0

    def __call__(self, name: Any, handles: Sequence[Any]) -> list[Any]:
        self.calls += 1
        self.started.set()
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        return self.fetch(name, handles)


def status_of(llm: LLM, request_id: str) -> RequestStatus:
    return llm.engine.groups[request_id].samples[0].request.status


def test_a_request_loading_from_disk_does_not_hold_up_the_others(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    expected = engine(tiny_llama_dir, None, enable_prefix_caching=False)
    want_doc, want_other = (expected.generate([p], GREEDY)[0].token_ids
                            for p in (DOC + QUESTION, OTHER))  # fmt: skip
    llm = engine(tiny_llama_dir, tmp_path / "kv")
    llm.generate([DOC], GREEDY)
    llm.flush_tiers()
    llm.cache.reset()  # the pool forgets it; the disk keeps it
    gated = GatedFetch(llm.disk_tier.fetch)
    llm.disk_tier.fetch = gated
    llm.engine.add_request("doc", DOC + QUESTION, GREEDY)
    llm.engine.add_request("other", OTHER, GREEDY)
    finished = {}
    while "other" not in finished:
        for output in llm.engine.step():
            if output.finished:
                finished[output.request_id] = output
        assert status_of(llm, "doc") is RequestStatus.LOADING
    assert gated.started.is_set() and gated.calls == 1
    assert finished["other"].outputs[0].token_ids == want_other
    llm.engine.scheduler.check_invariants()
    gated.gate.set()
    while llm.engine.has_unfinished():
        for output in llm.engine.step():
            if output.finished:
                finished[output.request_id] = output
    doc = finished["doc"]
    assert doc.outputs[0].token_ids == want_doc
    assert doc.num_cached_tokens >= len(DOC) - 4
    assert llm.stats()["disk_tier_hit_tokens"] >= len(DOC) - 4
    assert gated.calls == 1
    llm.cache.check_invariants()
    assert llm.cache.stats()["in_use"] == 0


def test_an_aborted_loading_request_leaves_nothing_behind(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    llm = engine(tiny_llama_dir, tmp_path / "kv")
    llm.generate([DOC], GREEDY)
    llm.flush_tiers()
    llm.cache.reset()
    gated = GatedFetch(llm.disk_tier.fetch)
    llm.disk_tier.fetch = gated
    llm.engine.add_request("doc", DOC + QUESTION, GREEDY)
    llm.engine.step()
    assert status_of(llm, "doc") is RequestStatus.LOADING
    llm.engine.abort("doc")
    gated.gate.set()
    assert not llm.engine.has_unfinished()
    llm.engine.scheduler.check_invariants()
    llm.cache.check_invariants()
    assert llm.cache.stats()["in_use"] == 0
    # the engine goes on serving, from the same disk
    assert llm.generate([DOC + QUESTION], GREEDY)[0].num_cached_tokens >= len(DOC) - 4


def test_a_tier_read_that_raises_costs_a_miss(tiny_llama_dir: Path, tmp_path: Path) -> None:
    expected = engine(tiny_llama_dir, None, enable_prefix_caching=False)
    want = expected.generate([DOC + QUESTION], GREEDY)[0].token_ids
    llm = engine(tiny_llama_dir, tmp_path / "kv")
    llm.generate([DOC], GREEDY)
    llm.flush_tiers()
    llm.cache.reset()

    def broken(name: Any, handles: Sequence[Any]) -> list[Any]:
        raise OSError("the disk went away")

    llm.disk_tier.fetch = broken
    out = llm.generate([DOC + QUESTION], GREEDY)[0]
    assert out.token_ids == want
    assert out.num_cached_tokens == 0
    assert llm.tiers.fetcher.failures == 1
    llm.cache.check_invariants()
