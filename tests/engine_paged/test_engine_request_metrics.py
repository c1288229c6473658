"""Per-request metrics: queue, TTFT, TPOT and e2e from the right timestamps, over every
sample of an ``n > 1`` request, and for aborted requests too."""

from __future__ import annotations

from pathlib import Path

from prefixcache.engine.llm import LLM
from prefixcache.engine.outputs import RequestOutput
from prefixcache.engine.sampling_params import SamplingParams

PROMPT = [7, 8, 9, 10, 11]


def run(llm: LLM, request_id: str, params: SamplingParams) -> RequestOutput:
    engine = llm.engine
    engine.add_request(request_id, PROMPT, params)
    final = None
    while engine.has_unfinished():
        for output in engine.step():
            final = output if output.finished else final
    assert final is not None
    return final


def test_metrics_are_ordered_and_queue_time_is_reported(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4)
    out = run(llm, "one", SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    metrics = out.metrics
    assert metrics.queue is not None and metrics.ttft is not None and metrics.e2e is not None
    assert 0 <= metrics.queue <= metrics.ttft <= metrics.e2e
    assert metrics.tpot is not None and metrics.tpot > 0


def test_forked_samples_pool_their_decode_time(tiny_llama_dir: Path) -> None:
    """A request whose first sample stops at its first token while another goes on: TPOT
    comes from the samples that decoded (it was None, sample 0's alone)."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=200, block_size=4)
    for seed in range(40):
        params = SamplingParams(n=3, max_tokens=12, temperature=3.0, seed=seed,
                                stop_token_ids=list(range(1, 60)))
        out = run(llm, f"forked-{seed}", params)
        lengths = [len(sample.token_ids) for sample in out.outputs]
        if lengths[0] == 1 and max(lengths) >= 3:
            break
    else:
        raise AssertionError("no seed made sample 0 stop first")
    assert out.metrics.tpot is not None and out.metrics.tpot > 0
    assert out.metrics.e2e is not None and out.metrics.e2e >= out.metrics.ttft
    assert llm.stats()["in_use"] == 0


def test_an_aborted_request_has_an_end_to_end_time(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64, block_size=4)
    engine = llm.engine
    engine.add_request("aborted", PROMPT, SamplingParams(max_tokens=30, ignore_eos=True))
    for _ in range(3):
        engine.step()
    final = engine.abort("aborted")
    assert final is not None and final.finished and final.finish_reason == "abort"
    assert final.metrics.e2e is not None and final.metrics.e2e >= final.metrics.ttft
    assert llm.stats()["in_use"] == 0
