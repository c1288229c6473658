"""AsyncLLM: streaming, many concurrent requests, aborts and disconnects free their blocks."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import prefixcache.engine.async_llm as async_llm_module
from prefixcache.engine.async_llm import AsyncLLM
from prefixcache.engine.llm import LLM
from prefixcache.engine.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: Path):
    engine = AsyncLLM(model=str(tiny_llama_dir), dtype="float32", num_blocks=128, block_size=4)
    yield engine
    engine.shutdown()


def checked_stats(llm: LLM) -> dict:
    llm.cache.check_invariants()
    return llm.stats()


async def collect(engine: AsyncLLM, prompt, request_id: str | None = None, params=GREEDY):
    outputs = [out async for out in engine.generate(prompt, params, request_id)]
    return outputs


def test_streams_growing_snapshots(engine: AsyncLLM, tiny_llama_dir: Path) -> None:
    outputs = asyncio.run(collect(engine, [1, 2, 3, 4, 5]))
    lengths = [len(o.token_ids) for o in outputs]
    assert lengths == list(range(1, 11)) and outputs[-1].finished
    assert not any(o.finished for o in outputs[:-1])
    reference = LLM(str(tiny_llama_dir), dtype="float32", num_blocks=64)
    assert outputs[-1].token_ids == reference.generate([[1, 2, 3, 4, 5]], GREEDY)[0].token_ids


def test_streamed_text_never_runs_past_a_stop_string(engine: AsyncLLM) -> None:
    """A stop string that spans two tokens: the snapshot after the first of them must not
    show its start, which the final text cuts; every snapshot's text is a prefix of the
    final one."""
    prompt = [1, 2, 3, 4, 5]
    plain = asyncio.run(collect(engine, prompt))[-1]
    text, ids = plain.text, plain.token_ids
    decoded = [engine.llm.tokenizer.decode(ids[:i]) for i in range(1, len(ids))]
    ends = [len(d) for d in decoded if d and text.startswith(d) and "\ufffd" not in d]
    spans = [e for e in ends if e < len(text) and text.find(text[e - 1 : e + 1]) == e - 1]
    assert spans, f"no token boundary to put a stop string across in {text!r}"
    stop = text[spans[0] - 1 : spans[0] + 1]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, stop=[stop])
    outputs = asyncio.run(collect(engine, prompt, params=params))
    final = outputs[-1].text
    assert final == text[: spans[0] - 1] and outputs[-1].finished
    assert all(final.startswith(out.text) for out in outputs)


def test_many_concurrent_requests_all_complete(engine: AsyncLLM) -> None:
    prompts = [[(i * 5 + j) % 200 + 1 for j in range(12 + i % 5)] for i in range(24)]

    async def run_all():
        return await asyncio.gather(*(collect(engine, p) for p in prompts))

    results = asyncio.run(run_all())
    assert all(r[-1].finished and len(r[-1].token_ids) == 10 for r in results)
    stats = engine.stats()
    assert stats["in_use"] == 0 and stats["running"] == 0


def test_leaving_the_stream_aborts_and_frees(engine: AsyncLLM) -> None:
    async def leave_early():
        stream = engine.generate([9, 8, 7, 6], SamplingParams(max_tokens=200, ignore_eos=True))
        async for out in stream:
            if len(out.token_ids) >= 2:
                break
        await stream.aclose()
        # the worker applies the abort before anything queued after it
        return await engine.call(checked_stats)

    stats = asyncio.run(leave_early())
    assert stats["in_use"] == 0 and stats["running"] == 0


def test_an_id_reused_right_after_an_abort_gets_only_its_own_outputs(
    engine: AsyncLLM,
) -> None:
    """Leave a stream early and at once stream another prompt under the same id: nothing of
    the aborted request (its final "abort" snapshot, a step's output in flight) reaches the
    new stream, which runs to its own end; the id is free again afterwards."""
    first, second = [4, 4, 4, 4], [7, 8, 9]
    long = SamplingParams(max_tokens=200, ignore_eos=True)

    async def run():
        stream = engine.generate(first, long, "reused")
        async for out in stream:
            if len(out.token_ids) >= 3:
                break
        await stream.aclose()
        again = await collect(engine, second, "reused")
        return again, await collect(engine, second, "reused"), await engine.call(checked_stats)

    again, third, stats = asyncio.run(run())
    assert all(out.prompt_token_ids == second and out.request_id == "reused" for out in again)
    assert again[-1].finished and again[-1].finish_reason == "length"
    assert [o.token_ids for o in again] == [o.token_ids for o in third]
    assert stats["in_use"] == 0 and stats["running"] == 0


def test_abort_by_id(engine: AsyncLLM) -> None:
    async def run():
        params = SamplingParams(max_tokens=300, ignore_eos=True)
        task = asyncio.ensure_future(collect(engine, [3, 3, 3], "to-abort", params))
        while not await engine.call(lambda llm: llm.stats()["running"]):
            pass
        await engine.abort("to-abort")
        return await task, await engine.call(checked_stats)

    outputs, stats = asyncio.run(run())
    assert outputs[-1].finished and outputs[-1].finish_reason == "abort"
    assert stats["in_use"] == 0


def test_bad_input_raises_before_queueing(engine: AsyncLLM) -> None:
    async def run(prompt, salt=None):
        return (
            await collect(engine, prompt)
            if salt is None
            else [o async for o in engine.generate(prompt, GREEDY, salt=salt)]
        )

    with pytest.raises(ValueError, match="vocabulary"):
        asyncio.run(run([1, 99999]))
    with pytest.raises(TypeError):
        asyncio.run(run([1, 2], salt=123))
    assert asyncio.run(run([1, 2]))[-1].finished


def test_warm_pin_and_reset(engine: AsyncLLM) -> None:
    prefix = list(range(30, 50))  # 20 tokens = 5 blocks of 4

    async def run():
        cached = await engine.warm(prefix, pin=True)
        survived = await engine.reset_cache()
        looked = await engine.call(lambda llm: llm.cache.lookup(prefix))
        await engine.unpin(prefix)
        await engine.reset_cache()
        after = await engine.call(lambda llm: llm.cache.lookup(prefix))
        return cached, survived, looked, after

    cached, _, looked, after = asyncio.run(run())
    assert cached == 20 and looked == 20 and after == 0


def test_the_model_loads_on_the_engine_thread(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built from keywords, the LLM is constructed on the worker thread that steps it (one
    OpenMP pool for all of the engine's torch work), and it serves."""
    built_on: list[str] = []

    def recording_llm(**kwargs):
        built_on.append(threading.current_thread().name)
        return LLM(**kwargs)

    monkeypatch.setattr(async_llm_module, "LLM", recording_llm)
    engine = AsyncLLM(model=str(tiny_llama_dir), dtype="float32", num_blocks=32, block_size=4)
    try:
        assert built_on == ["prefixcache-engine"]
        assert engine._worker.name == "prefixcache-engine"
        outputs = asyncio.run(collect(engine, list(range(1, 9))))
        assert outputs[-1].finished and len(outputs[-1].token_ids) == GREEDY.max_tokens
    finally:
        engine.shutdown()


def test_a_loading_error_raises_from_the_constructor(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model"):
        AsyncLLM(model=str(tmp_path / "missing"))
    with pytest.raises(TypeError):
        AsyncLLM(model="smollm2", no_such_option=1)
